set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; cp /tmp/item.log $OUT/log_$(date +%s).txt; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=10 item kernel_tests python -m pytest -q -rf tests/kernels/test_fused_moe_int.py tests/kernels/test_fused_moe_fp8.py -k "not sm90 and (real_shape or gemv or matches_reference)" -x
TAILN=8 item engine_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_moe.py tests/quantization/test_quantized_moe.py tests/quantization/test_real_quantized_moe.py
TAILN=14 item moe_int4 python benchmarks/moe_kernel.py --bits 4 --tokens 1 16 --tiles 16,32,128,4,4 16,64,64,4,3 --json $OUT/moe_int4.json
TAILN=14 item moe_fp8b python benchmarks/moe_kernel.py --fp8 blocks --tokens 1 16 --tiles 16,64,128,4,3 16,32,128,4,4 16,64,64,4,3 --json $OUT/moe_fp8b.json
TAILN=10 item moe_fp8r python benchmarks/moe_kernel.py --fp8 rows --tokens 1 16 --tiles 16,64,128,4,3 16,32,128,4,4 --json $OUT/moe_fp8r.json
TAILN=14 item q_moe python benchmarks/quantized.py --shape qwen3-30b-a3b --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q_moe.json
TAILN=8 item q_moe_gemv env OCTAVO_MOE_INT_GEMV=128 python benchmarks/quantized.py --shape qwen3-30b-a3b --methods w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q_moe_gemv.json
echo "=== end $(date +%T)"
