# Session 55 call 2: the CUDA swap-AB kernel with its copies spread over the producer
# warpgroup (addresses set up once), the scales through the ring, and the split-K reduction a
# split at a time.
export BUDGET=420
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=10 item t_wgmma timeout 150 python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wgmma.py
CUDA_OK=0; grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log && CUDA_OK=1
echo "cuda kernel ok: $CUDA_OK"
TAILN=4 item t_route python -m pytest -m gpu -q -rf tests/quantization/test_swapab_large.py -k routing
if [ "$CUDA_OK" = 1 ]; then
TAILN=22 item g_cuda timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 129 256 384 --json /tmp/res/g_cuda.json
OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_wgmma python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_wgmma.json
fi
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
echo "=== end $(date +%T)"
