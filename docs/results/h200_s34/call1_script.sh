set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
TAILN=40 item sweep python benchmarks/int8_gemv.py --m 1 --sweep --json $OUT/sweep.json
TAILN=12 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_int8_gemv.py tests/kernels/test_int8_rows_gemm.py tests/quantization/test_compressed_tensors.py -k "rows or real or tiled or every or fixture"
TAILN=30 item prof_w4a16 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 1 --context 128 --json $OUT/prof_w4a16.json
TAILN=30 item prof_b32 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 32 --context 256 --json $OUT/prof_b32.json
echo "=== end $(date +%T)"
