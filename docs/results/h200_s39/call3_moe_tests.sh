set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-500}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
TAILN=14 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_fused_moe.py tests/test_moe.py
TAILN=3 item w1_moe python benchmarks/throughput.py --workload W1 --shape qwen3-30b-a3b --json-out $OUT/moe_w1.json
echo "=== end $(date +%T)"
