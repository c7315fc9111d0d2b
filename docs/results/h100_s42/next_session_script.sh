# The next session's first device call (copy to .snap/, carry [".snap"]). Session 42's call A
# measured the grouped integer MoE launches (tree 39ac457) on an H100; the final code
# (b937be3: the bias + q path removed, decode tiles 16 x 32 x 128 x 4 stages; 5cb11c3: the
# grouped GEMV behind OCTAVO_MOE_INT_GEMV) has passed its tests only in the CPU interpreter
# and offline sm_90 compiles. First its GPU tests, then the engine figures and the GEMV A/B,
# then session 41's open items.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; cp /tmp/item.log $OUT/log_$(date +%s).txt; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=8 item int_tests python -m pytest -q -rf tests/kernels/test_fused_moe_int.py -k "not sm90"
TAILN=6 item engine_tests python -m pytest -m gpu -q -rf tests/quantization/test_quantized_moe.py tests/quantization/test_real_quantized_moe.py
TAILN=30 item moe_int4 python benchmarks/moe_kernel.py --bits 4 --tokens 1 4 16 --tiles 16,32,128,4,4 16,64,64,4,3 --json $OUT/moe_int4.json
TAILN=20 item moe_int8 python benchmarks/moe_kernel.py --bits 8 --tokens 1 16 --tiles 16,32,128,4,4 16,64,64,4,3 --json $OUT/moe_int8.json
TAILN=12 item q_moe python benchmarks/quantized.py --shape qwen3-30b-a3b --methods w4a16,bf16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q_moe.json
TAILN=8 item q_moe_gemv env OCTAVO_MOE_INT_GEMV=128 python benchmarks/quantized.py --shape qwen3-30b-a3b --methods w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q_moe_gemv.json
TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
echo "=== end $(date +%T)"
