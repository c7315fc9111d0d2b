# The next session's first device call (copy to .snap/, carry [".snap"]): settles session 36's
# prefill tile on W1 itself, then re-reads the targets at main's head.
# Each item runs python directly under `timeout -k`: session 36's `sh -c "python | grep"` left
# a Python running past its timeout into the next call.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
w1sum() {  # a throughput JSON's figures: tok/s, prefill and decode seconds
   python -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; b=r['step_breakdown']; print(sys.argv[1], round(r['output_tok_s']), 'prefill_s', round(b['prefill_s'],3), 'decode_s', round(b['decode_s'],3))" $1; }
TAILN=1 item w1_new python benchmarks/throughput.py --workload W1 --json-out $OUT/w1_new_a.json; w1sum $OUT/w1_new_a.json
TAILN=1 item w1_old env OCTAVO_ATTN_PREFILL_TILE=64,8,2 python benchmarks/throughput.py --workload W1 --json-out $OUT/w1_old_a.json; w1sum $OUT/w1_old_a.json
TAILN=1 item w1_new python benchmarks/throughput.py --workload W1 --json-out $OUT/w1_new_b.json; w1sum $OUT/w1_new_b.json
TAILN=1 item w1_old env OCTAVO_ATTN_PREFILL_TILE=64,8,2 python benchmarks/throughput.py --workload W1 --json-out $OUT/w1_old_b.json; w1sum $OUT/w1_old_b.json
# 8 warps won W1's prefill shape in the tile probe (242 vs 224 TFLOP/s) and lost Llama's (179 vs 250):
TAILN=1 item w1_w8 env OCTAVO_ATTN_PREFILL_TILE=32,8,3 python benchmarks/throughput.py --workload W1 --json-out $OUT/w1_w8.json; w1sum $OUT/w1_w8.json
TAILN=1 item w2 python benchmarks/throughput.py --workload W2 --json-out $OUT/w2.json; w1sum $OUT/w2.json
TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
TAILN=6 item q python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q.json
echo "=== end $(date +%T)"
