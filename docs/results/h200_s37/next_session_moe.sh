# A device call for the mixture-of-experts work of session 37 (no device was lent that
# session): run after docs/results/h200_s36/next_session_script.sh (its own call; copy both to
# .snap/, carry [".snap"]). Decides OCTAVO_FUSED_MOE's default: the grouped Triton kernel
# (octavo/kernels/fused_moe.py, never run on a GPU) against the expert loop, on the
# Qwen3-30B-A3B shape (dummy weights, 61 GB bf16).
# If the GPU tests pass and the fused rows win, make envs.fused_moe() default on.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
TAILN=8 item gpu_tests python -m pytest -m gpu -q -x tests/kernels/test_fused_moe.py tests/test_moe.py
TAILN=6 item lat_fused env OCTAVO_FUSED_MOE=1 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16,64,256 --json-out $OUT/moe_lat_fused.json
TAILN=6 item lat_loop env OCTAVO_FUSED_MOE=0 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16,64 --json-out $OUT/moe_lat_loop.json
TAILN=3 item w1_moe env OCTAVO_FUSED_MOE=1 python benchmarks/throughput.py --workload W1 --shape qwen3-30b-a3b --json-out $OUT/moe_w1.json
echo "=== end $(date +%T)"
