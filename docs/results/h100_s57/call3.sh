# Session 57, call 3: the final default (CUDA large-batch kernel from 65 rows; the cluster sum
# removed from the kernel) on the GPU: the kernel's GPU tests and the routing tests, then the
# engine at batch 96 / 128 + W2 against bf16.
export BUDGET=${BUDGET:-220}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item t_gpu timeout 100 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py tests/kernels/test_split_sum.py tests/quantization/test_swapab_large.py -k "routing or wgmma or split"
TAILN=8 item q_final python benchmarks/quantized.py --methods bf16,w4a16 --batches 96 128 --json /tmp/res/q_final.json
echo "=== end $(date +%T)"
