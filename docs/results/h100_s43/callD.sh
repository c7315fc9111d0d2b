set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-540}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/callD.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; git log --oneline -1 2>/dev/null
TAILN=6 item kernel_tests python -m pytest -q -rf tests/kernels/test_fused_moe_fp8.py tests/kernels/test_fused_moe_int.py -k "not sm90"
TAILN=6 item engine_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_moe.py tests/quantization/test_quantized_moe.py tests/quantization/test_real_quantized_moe.py
TAILN=16 item q_moe python benchmarks/quantized.py --shape qwen3-30b-a3b --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_moe.json
TAILN=14 item moe_int4 python benchmarks/moe_kernel.py --bits 4 --tokens 32 64 --tiles 16,64,64,4,3 64,64,64,4,3 --json /tmp/res/moe_int4.json
TAILN=14 item moe_int8 python benchmarks/moe_kernel.py --bits 8 --tokens 1 16 64 --tiles 16,32,128,4,4 16,64,64,4,3 --json /tmp/res/moe_int8.json
TAILN=10 item moe_fp8b python benchmarks/moe_kernel.py --fp8 blocks --tokens 4 64 --tiles 16,32,128,4,4 16,64,128,4,3 16,32,64,4,4 --json /tmp/res/moe_fp8b.json
echo "=== end $(date +%T)"
