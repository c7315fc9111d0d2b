# The next session's first device call (copy to .snap/, carry [".snap"]). Session 41 measured
# the MoE routing launch on an H100 (call 1) but could not start a machine again: the final
# code (e0e39ac: passes 3-4 from registers, 16x64x128 decode tiles, float32 K steps of 64)
# has passed its tests only in the CPU interpreter and offline sm_90 compiles. So first its GPU
# tests, then the A/B that says what it buys, then session 39's open profiles.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item kernel_tests python -m pytest -q -rf -x tests/kernels/test_moe_route.py tests/kernels/test_fused_moe.py -k "not sm90"
TAILN=4 item engine_tests python -m pytest -m gpu -q -rf tests/test_moe.py
TAILN=3 item lat_route1 env OCTAVO_MOE_ROUTE=1 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --json-out $OUT/moe_lat_route1.json
TAILN=3 item lat_route0 env OCTAVO_MOE_ROUTE=0 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --json-out $OUT/moe_lat_route0.json
TAILN=3 item lat_dense32 env OCTAVO_CUDA_DENSE_MAX_BYTES=33554432 python benchmarks/latency.py --shape qwen3-30b-a3b --batch-sizes 1,16 --json-out $OUT/moe_lat_dense32.json
TAILN=30 item prof_moe_b1 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-30b-a3b --batch 1 --context 128 --steps 8 --json $OUT/prof_moe_b1.json
TAILN=30 item moe_kernel python benchmarks/moe_kernel.py --tiles 16,64,128,4,3 16,64,64,4,3 16,32,256,4,3 --json $OUT/moe_kernel.json
# prefill-sized MoE tiles (64-row tiles from T*k >= 32E; never measured)
TAILN=30 item moe_kernel_prefill python benchmarks/moe_kernel.py --tokens 1024 4096 --tiles 64,64,64,4,3 64,128,64,4,3 64,128,64,8,3 128,128,64,8,3 64,64,128,4,3 --json $OUT/moe_kernel_prefill.json
TAILN=40 item prof_w4_b32 env OCTAVO_PDL=0 python benchmarks/profile_step.py --batch 32 --context 256 --json $OUT/prof_b32.json
TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
echo "=== end $(date +%T)"
