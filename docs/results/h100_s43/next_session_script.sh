# The next session's first device call (copy to .snap/, carry [".snap"]). Session 43 ran the
# FP8 MoE path, the grouped integer GEMV and the dense block-FP8 kernels on an H100; not yet
# on a GPU: the engine tests added after call F (block FP8 dense in float32 against the
# dequantized layers; compressed-tensors W8A8 experts), block FP8 past 16 rows and in
# prefill (the GEMM to 256 rows, then dequantize per call), W2 with block FP8.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-560}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/res.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=6 item gpu_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_blocks.py tests/quantization/test_fp8_moe.py tests/kernels/test_fp8_block_gemm.py tests/quantization/test_fp8.py
TAILN=16 item q_block python benchmarks/quantized.py --methods bf16,fp8_block,fp8 --batches 1 16 64 256 --json /tmp/res/q_block.json
TAILN=6 item q_block_off env OCTAVO_FP8_BLOCK_GEMM_MAX_M=0 python benchmarks/quantized.py --methods fp8_block --batches 64 256 --json /tmp/res/q_block_off.json
TAILN=14 item q_moe python benchmarks/quantized.py --shape qwen3-30b-a3b --methods bf16,w4a16,fp8_block --batches 1 16 64 --skip-w2 --json /tmp/res/q_moe.json
echo "=== end $(date +%T)"
