# Session 44, call 3: W8A8 blockwise _scaled_mm past 16 rows for kept block-FP8 layers; the engine and W2 re-read.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-450}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/res.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=10 item gpu_tests python -m pytest -m gpu -q -rf -x tests/kernels/test_fp8_group_quant.py tests/kernels/test_fp8_block_gemm.py tests/kernels/test_fp8_block_gemv.py tests/quantization/test_fp8_blocks.py
TAILN=22 item sweep python benchmarks/fp8_block_gemm.py --m 16 32 64 256 1024 --tiles 16x32x128x4x4 --json /tmp/res/sweep.json
TAILN=8 item q_block python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 16 32 64 256 --skip-w2 --json /tmp/res/q_block.json
TAILN=6 item q_w2 python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 --json /tmp/res/q_w2.json
echo "=== end $(date +%T)"
