# Session 59's short call (copy to .snap/, carry [".snap"]; BUDGET=<s> to fit what is left):
# the GPU tests of the four pieces never run on a GPU (the unrolled K-split sum, the fp16
# large-batch form, the gated and rotary decode stores), W4A16 batch 1 / 16 with bf16 in the
# same call, then each store on and both (each only where its tests passed), then batch 256 /
# W2, bf16x2 and the float16 form.
export BUDGET=${BUDGET:-330}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=8 item t_gpu timeout 200 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_rope.py tests/kernels/test_split_sum.py tests/kernels/test_swapab_wgmma.py -k "glu or gated or blocked or rope or rotary or split_sum or launch_sum or fp16"
GLU=0
grep -q " passed" /tmp/res/t_gpu.log && ! grep -q "test_swapab_glu.*FAILED\|test_swapab_glu.*ERROR" /tmp/res/t_gpu.log && GLU=1
ROPE=0
grep -q " passed" /tmp/res/t_gpu.log && ! grep -q "test_swapab_rope.*FAILED\|test_swapab_rope.*ERROR" /tmp/res/t_gpu.log && ROPE=1
echo "glu: $GLU rope: $ROPE"
TAILN=6 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q.json
[ $GLU = 1 ] && OCTAVO_SWAPAB_GLU=1 TAILN=4 item q_glu python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_glu.json
[ $ROPE = 1 ] && OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_rope python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_rope.json
[ $GLU$ROPE = 11 ] && OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_both python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_both.json
TAILN=6 item q_w2 python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_w2.json
OCTAVO_INT_LARGE_BF16_MATH=1 TAILN=4 item q_bf16x2 python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_bf16x2.json
TAILN=6 item q_f16 python benchmarks/quantized.py --dtype float16 --methods bf16,w4a16 --batches 256 --skip-w2 --json /tmp/res/q_f16.json
OCTAVO_INT_LARGE_F16=1 TAILN=4 item q_f16_on python benchmarks/quantized.py --dtype float16 --methods w4a16 --batches 256 --skip-w2 --json /tmp/res/q_f16_on.json
echo "=== end $(date +%T)"
