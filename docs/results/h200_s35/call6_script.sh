set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-290}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 20 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=20 item probe python .snap/probe_swap.py
P=benchmarks/quantized.py
TAILN=8 item q_swap python $P --methods bf16,fp8 --batches 16 64 --skip-w2 --json $OUT/q_swap.json
TAILN=4 item q_noswap env OCTAVO_FP8_SWAP_MAX_M=0 python $P --methods fp8 --batches 16 64 --skip-w2 --json $OUT/q_noswap.json
TAILN=4 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fp8_quant.py tests/quantization/test_fp8.py
echo "=== end $(date +%T)"
