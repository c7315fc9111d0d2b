set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=4 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_paged_attention.py tests/test_triton_e2e.py
TAILN=8 item probe python .snap/probe_prefill.py
TAILN=12 item prof_prefill env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-0.6b --prefill 16384 --json $OUT/prof_prefill.json
TAILN=4 item w1 sh -c "python benchmarks/throughput.py --workload W1 --json-out $OUT/w1.json | grep tok/s"
TAILN=4 item w2 sh -c "python benchmarks/throughput.py --workload W2 --json-out $OUT/w2.json | grep tok/s"
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
TAILN=12 item q python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q.json
echo "=== end $(date +%T)"
