set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-480}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=20 item sweep python benchmarks/wide_gemm.py --sweep --m 64 128 192 256 --json $OUT/sweep.json
TAILN=4 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/quantization/test_w4a16_swapab_wide.py
P=benchmarks/quantized.py
TAILN=8 item q_wide env OCTAVO_INT_WIDE_MIN_M=129 python $P --methods bf16,w4a16 --batches 256 --json $OUT/q_wide.json
TAILN=30 item i8sweep python benchmarks/int8_gemv.py --m 64 --sweep --json $OUT/i8_m64.json
echo "=== end $(date +%T)"
