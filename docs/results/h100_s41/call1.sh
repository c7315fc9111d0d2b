set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-540}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=12 item kernel_tests python -m pytest -q -rf -x tests/kernels/test_moe_route.py tests/kernels/test_fused_moe.py
TAILN=60 item moe_kernel python benchmarks/moe_kernel.py --json $OUT/moe_kernel.json
TAILN=12 item engine_tests python -m pytest -m gpu -q -rf tests/test_moe.py
TAILN=5 item lat_route1 env OCTAVO_MOE_ROUTE=1 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --json-out $OUT/moe_lat_route1.json
TAILN=5 item lat_route0 env OCTAVO_MOE_ROUTE=0 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --json-out $OUT/moe_lat_route0.json
TAILN=40 item prof_moe_b1 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-30b-a3b --batch 1 --context 128 --steps 8 --json $OUT/prof_moe_b1.json
echo "=== end $(date +%T)"
