# Session 44, call 2: the folded block GEMV on by default, the one-launch dequantize, the block GEMM's tiles swept.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-540}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/res.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=8 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_fp8_block_gemm.py tests/kernels/test_fp8_block_gemv.py tests/quantization/test_fp8_blocks.py
TAILN=30 item sweep python benchmarks/fp8_block_gemm.py --json /tmp/res/sweep.json
TAILN=12 item q_block python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 2 16 64 256 --skip-w2 --json /tmp/res/q_block.json
TAILN=6 item q_block_off env OCTAVO_FP8_BLOCK_GEMM_MAX_M=0 python benchmarks/quantized.py --methods fp8_block --batches 16 64 256 --skip-w2 --json /tmp/res/q_block_off.json
echo "=== end $(date +%T)"
