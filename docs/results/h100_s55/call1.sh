# The next session's first device call (copy to .snap/, carry [".snap"]; about 7 minutes with
# its start). Session 54 built two large-batch 4-bit GEMMs, both off:
# - swapab_large (Triton; measured per layer: gate_up at 256 rows 186.9 us against 212.0
#   serial), never run in the engine (its first engine run failed on fp16 scales, fixed);
# - swapab_wgmma (CUDA, warp-specialized, sm_90a), never run on a GPU: its tests first (the
#   one-hot test's message locates wrong indices; a stuck producer traps), then per layer, then
#   in the engine, the CUDA parts only where its tests passed (a trap spoils the process).
export BUDGET=480
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=10 item t_wgmma timeout 150 python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wgmma.py
CUDA_OK=0; grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log && CUDA_OK=1
echo "cuda kernel ok: $CUDA_OK"
# (Where the tests failed, a script dumped the one-hot outputs; they passed, it never ran.)
NO_CUDA=$([ "$CUDA_OK" = 1 ] || echo --no-cuda)
TAILN=6 item t_large python -m pytest -m gpu -q -rf -x tests/quantization/test_swapab_large.py -k "default or bits or graph or routing"
TAILN=6 item g_large timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 129 192 256 384 $NO_CUDA --json /tmp/res/g_large.json
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_LARGE_MAX_M=256 TAILN=3 item q_large python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_large.json
if [ "$CUDA_OK" = 1 ]; then
OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_wgmma python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_wgmma.json
fi
echo "=== end $(date +%T)"
