. scripts/device_items.sh
TAILN=10 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 64 256 --skip-w2 --json /tmp/res/q_base.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=6 item q_small16 python benchmarks/quantized.py --methods w4a16 --batches 1 16 64 256 --skip-w2 --json /tmp/res/q_small16.json
echo "=== end $(date +%T)"
