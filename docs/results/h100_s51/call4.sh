. scripts/device_items.sh
TAILN=10 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --stall-stacks --json-out /tmp/res/w1_pen2.json
TAILN=12 item k16 python benchmarks/quantized_gemm.py --bits 4 --paths default swapab cuda --m 16 --json /tmp/res/k16.json
TAILN=4 item e16_default python benchmarks/quantized.py --methods w4a16 --batches 16 --skip-w2 --json /tmp/res/e16_default.json
OCTAVO_CUDA_KERNELS_MAX_M=16 TAILN=4 item e16_cuda python benchmarks/quantized.py --methods w4a16 --batches 16 --skip-w2 --json /tmp/res/e16_cuda.json
echo "=== end $(date +%T)"
