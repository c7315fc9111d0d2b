# The next session's first device call (copy to .snap/, carry [".snap"]; about 6 minutes with
# its start). Session 55 made the CUDA large-batch 4-bit GEMM (swapab_wgmma) 2.3x faster and
# routed it to the layers it wins on (worth: Llama-8B gate_up / down), then ran out of device
# time before the engine ran it so routed, and before its bf16x2 dequantization
# (OCTAVO_INT_LARGE_BF16_MATH) ever ran on a GPU. In order: its GPU tests (both forms), the
# layers (both forms), the serial baseline, the engine with the float form, then with the bf16
# form where its tests passed.
export BUDGET=440
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=8 item t_wgmma timeout 90 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py
BF_OK=0; grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log && BF_OK=1
FLOAT_OK=0; grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "FAILED.*False\]" /tmp/res/t_wgmma.log && FLOAT_OK=1
echo "float form ok: $FLOAT_OK, bf16 form ok: $BF_OK"
TAILN=16 item g_cuda timeout 120 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 129 192 256 --json /tmp/res/g_cuda.json
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
[ "$FLOAT_OK" = 1 ] && OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_cuda python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_cuda.json
[ "$BF_OK" = 1 ] && OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 OCTAVO_INT_LARGE_BF16_MATH=1 TAILN=3 item q_cuda_bf python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_cuda_bf.json
echo "=== end $(date +%T)"
