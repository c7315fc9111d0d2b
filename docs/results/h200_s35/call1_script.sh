set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=8 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/quantization/test_w4a16_swapab_wide.py -x
TAILN=40 item sweep python benchmarks/wide_gemm.py --sweep --m 64 128 192 256 --json $OUT/sweep.json
TAILN=12 item large python benchmarks/wide_gemm.py --m 512 1024 2048 --json $OUT/large.json
P=benchmarks/quantized.py
TAILN=14 item q_wide python $P --methods bf16,w4a16 --batches 64 256 --json $OUT/q_wide.json
TAILN=8 item q_off env OCTAVO_INT_WIDE_MIN_M=100000 python $P --methods w4a16 --batches 64 256 --json $OUT/q_off.json
echo "=== end $(date +%T)"
