# Session 58's short call (little device time left): the GPU tests of the three unrun
# pieces (the unrolled K-split sum, the fp16 large-batch form, the gated and rotary decode stores), then
# W4A16 batch 1 / 16 with the gated store off (default) and on, bf16 in the same call.
export BUDGET=${BUDGET:-330}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=8 item t_gpu timeout 200 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_rope.py tests/kernels/test_split_sum.py tests/kernels/test_swapab_wgmma.py -k "glu or gated or blocked or rope or rotary or split_sum or launch_sum or fp16"
GLU=0
grep -q " passed" /tmp/res/t_gpu.log && ! grep -q "FAILED\|ERROR" /tmp/res/t_gpu.log && GLU=1
echo "all passed: $GLU"
TAILN=6 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q.json
if [ $GLU = 1 ]; then
  OCTAVO_SWAPAB_GLU=1 TAILN=4 item q_glu python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_glu.json
  OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_both python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_both.json
fi
TAILN=6 item q_w2 python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_w2.json
OCTAVO_INT_LARGE_BF16_MATH=1 TAILN=4 item q_bf16x2 python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_bf16x2.json
TAILN=6 item q_f16 python benchmarks/quantized.py --dtype float16 --methods bf16,w4a16 --batches 256 --skip-w2 --json /tmp/res/q_f16.json
OCTAVO_INT_LARGE_F16=1 TAILN=4 item q_f16_on python benchmarks/quantized.py --dtype float16 --methods w4a16 --batches 256 --skip-w2 --json /tmp/res/q_f16_on.json
echo "=== end $(date +%T)"
