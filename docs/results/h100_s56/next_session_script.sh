# The next session's first device call (copy to .snap/, carry [".snap"]; about 8 minutes with
# its start). Session 56 got no device machine (every start refused), so this is session 55's
# prepared call plus session 56's A/B: the CUDA large-batch 4-bit GEMM (swapab_wgmma) summing
# its K-split partials in a second launch over every SM (OCTAVO_INT_LARGE_SUM_LAUNCH, split_sum)
# instead of in each tile's last CTA. At 256 rows qkv / o / down run 25-40 us past what their
# MMA steps predict (H100, session 55), and 129 rows 14-16 us less than 256, as if the last
# CTA's lone sum of 256-512 KB were the cost. If the launch sum removes it, qkv (~67 -> ~43 us)
# and o (~57 -> ~25) would beat dequantize-then-cuBLAS (50 / 33) and worth's split line
# (OCTAVO_INT_LARGE_MIN_SPLIT_STEPS, 48) can drop.
# In order: the GPU tests (all four forms, the launch sum), the layers at 128 / 256 rows with
# every form, unsplit ("split1") and with the launch sum ("launch"); the baseline (bf16, and
# W4A16 at the default: Triton on gate_up at 129-256 rows); the engine with the float form
# routed by worth; the same with the launch sum and every split layer routed; then the fastest
# correct form on gate_up + down (scripts/pick_wgmma_form.py) where that is another.
export BUDGET=${BUDGET:-480}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=10 item t_wgmma timeout 120 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py tests/kernels/test_split_sum.py
FORMS="cuda cuda_bf16 cuda_deep cuda_bf16_deep"
grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log || FORMS=cuda
echo "forms timed: $FORMS"
TAILN=10 item g_cuda timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 128 256 --forms $FORMS --splits 1 --json /tmp/res/g_cuda.json
FORM=$(python scripts/pick_wgmma_form.py /tmp/res/g_cuda.json --m 256 2>/dev/null || echo "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0")
echo "fastest correct form: $FORM"
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
export OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1
TAILN=3 item q_cuda python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_cuda.json
OCTAVO_INT_LARGE_SUM_LAUNCH=1 OCTAVO_INT_LARGE_MIN_SPLIT_STEPS=1 TAILN=3 item q_launch python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_launch.json
if [ "$FORM" != "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0" ]; then
(export $FORM; TAILN=3 item q_best python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_best.json)
fi
echo "=== end $(date +%T)"
