set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-190}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 20 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=4 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_int8_rows_gemm.py
TAILN=6 item q16 env OCTAVO_INT_WEIGHT_LAYOUT=rows python benchmarks/quantized.py --methods w8a16_channel --batches 16 --skip-w2 --json $OUT/d1.json
TAILN=20 item micro python benchmarks/int8_gemv.py --m 1 --shapes qkv,down --json $OUT/dmicro.json
echo "=== end $(date +%T)"
