# The next session's first device call (copy to .snap/, carry [".snap"]; about 7 minutes with
# its start). Session 54 built two large-batch 4-bit GEMMs, both off:
# - swapab_large (Triton; measured per layer: gate_up at 256 rows 186.9 us against 212.0
#   serial), never run in the engine (its first engine run failed on fp16 scales, fixed);
# - swapab_wgmma (CUDA, warp-specialized, sm_90a), never run on a GPU: its tests first (a
#   fault there hangs or fails; the timeout bounds it), then per layer, then in the engine.
export BUDGET=480
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=8 item t_wgmma timeout 150 python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wgmma.py
TAILN=6 item t_large python -m pytest -m gpu -q -rf -x tests/quantization/test_swapab_large.py -k "default or bits or graph or routing"
TAILN=6 item g_large timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down --m 129 192 256 384 --json /tmp/res/g_large.json
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_LARGE_MAX_M=256 TAILN=3 item q_large python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_large.json
if grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log; then
OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_wgmma python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_wgmma.json
fi
echo "=== end $(date +%T)"
