set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
P=benchmarks/quantized.py
TAILN=12 item q_rows python $P --methods bf16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q_rows.json
TAILN=8 item q_alongk env OCTAVO_INT_WEIGHT_LAYOUT=along_k python $P --methods w8a16 --batches 1 16 --skip-w2 --json $OUT/q_alongk.json
TAILN=8 item q_norope env OCTAVO_FUSED_QKV_ROPE=0 python $P --methods w8a16 --batches 1 --skip-w2 --json $OUT/q_norope.json
TAILN=8 item micro python benchmarks/int8_gemv.py --m 1 --json $OUT/micro.json
TAILN=8 item gputests python -m pytest -q -p no:cacheprovider tests/quantization/test_compressed_tensors.py tests/quantization/test_fp8.py tests/quantization/test_int_weight_layout.py tests/kernels/test_int8_gemv.py
TAILN=24 item prof_b32 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 32 --context 256 --json $OUT/prof_b32.json
echo "=== end $(date +%T)"
