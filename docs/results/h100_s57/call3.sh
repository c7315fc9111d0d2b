# Session 57, call 3: the final default (CUDA large-batch kernel from 65 rows) on the GPU: the
# routing tests, and the engine at batch 64 / 96 / 128 / 256 + W2 against bf16.
export BUDGET=${BUDGET:-230}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item t_route timeout 90 python -m pytest -m gpu -q -rf -k "routing" tests/kernels/test_swapab_wgmma.py tests/quantization/test_swapab_large.py
TAILN=8 item q_final python benchmarks/quantized.py --methods bf16,w4a16 --batches 64 96 128 256 --json /tmp/res/q_final.json
echo "=== end $(date +%T)"
