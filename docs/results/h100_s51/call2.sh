. scripts/device_items.sh
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=6 item q_c python benchmarks/quantized.py --methods w4a16 --batches 1 16 32 64 128 --skip-w2 --json /tmp/res/q_c.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M=128 TAILN=6 item q_c_chunked python benchmarks/quantized.py --methods w4a16 --batches 1 16 32 64 128 --skip-w2 --json /tmp/res/q_c_chunked.json
OCTAVO_SWAPAB_STAGES=0 OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=4 item q_c_p0 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_c_p0.json
OCTAVO_SWAPAB_STAGES=3 OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=4 item q_c_p3 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_c_p3.json
OCTAVO_SWAPAB_STAGES=4 OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=4 item q_c_p4 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_c_p4.json
OCTAVO_BNB4_GEMM_MAX_M=32 TAILN=4 item e_nf4_32 python benchmarks/quantized.py --methods nf4 --batches 24 32 --skip-w2 --json /tmp/res/e_nf4_32.json
OCTAVO_BNB4_GEMM_MAX_M=16 TAILN=4 item e_nf4_16 python benchmarks/quantized.py --methods nf4 --batches 24 32 --skip-w2 --json /tmp/res/e_nf4_16.json
TAILN=20 item sweep_swapab python benchmarks/quantized_gemm.py --sweep --paths swapab --bits 4 --m 32 64 128 --json /tmp/res/sweep_swapab.json
TAILN=5 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
echo "=== end $(date +%T)"
