set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-540}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
P=benchmarks/quantized.py
TAILN=12 item q_rows python $P --methods bf16,w8a16 --batches 1 16 64 256 --skip-w2 --json $OUT/q_rows.json
TAILN=8 item q_alongk env OCTAVO_INT_WEIGHT_LAYOUT=along_k python $P --methods w8a16 --batches 1 16 64 256 --skip-w2 --json $OUT/q_alongk.json
TAILN=8 item gputests python -m pytest -q -p no:cacheprovider tests/quantization/test_compressed_tensors.py tests/kernels/test_int8_gemv.py -k "fixture or rows or gpu or rope or scaled_mm"
TAILN=16 item prof_rows env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w8a16 --batch 1 --context 128 --json $OUT/prof_rows.json
TAILN=16 item prof_alongk env OCTAVO_PDL=0 OCTAVO_INT_WEIGHT_LAYOUT=along_k python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w8a16 --batch 1 --context 128 --json $OUT/prof_alongk.json
echo "=== end $(date +%T)"
