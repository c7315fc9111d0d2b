# Session 64 call 1: the 8-bit form of the CUDA large-batch kernel (swapab_wgmma, working
# tree on b5e2ac8): its GPU tests, its per-layer times against the engine's 8-bit paths past
# 64 rows, W8A16 in the engine with it (OCTAVO_INT_LARGE_CUDA_8BIT=1) and without; then, with
# what is left, W3's server against offline at HEAD (last read on an H200 in session 12).
export BUDGET=${BUDGET:-560}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
TAILN=4 item t_wg8 timeout 200 python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wgmma.py -k "8_bit or one_hot or integer"
TAILN=14 item g8 python benchmarks/large_int_gemm.py --bits 8 --m 48 64 128 256 --forms cuda_bf16_deep cuda_deep --json /tmp/res/g8.json
OCTAVO_INT_LARGE_CUDA_8BIT=1 TAILN=4 item e8_on python benchmarks/quantized.py --methods bf16,w8a16 --batches 64 128 256 --json /tmp/res/e8_on.json
TAILN=3 item e8_off python benchmarks/quantized.py --methods w8a16 --batches 64 128 256 --json /tmp/res/e8_off.json
TAILN=3 item t_layout timeout 120 python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
PYTHONPATH=/tmp/site:. TAILN=14 item w3 python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3.json
echo "=== end $(date +%T)"
