# Session 47 call 1: the NF4 CUDA GEMV at 3-16 rows (OCTAVO_BNB4_CUDA_MAX_M=16), the 8-bit
# rows GEMV's WIDE g128 steps (OCTAVO_GEMV_WIDE_GROUPS), then issue 12/15 figures.
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=6 item gpu_tests env OCTAVO_BNB4_CUDA_MAX_M=16 python -m pytest -m gpu -q -rf tests/kernels/test_bnb4_cuda.py tests/kernels/test_int8_gemv.py tests/kernels/test_fp8_block_gemv.py
TAILN=40 item int8_gemv python benchmarks/int8_gemv.py --m 1 --json /tmp/res/int8_gemv.json
TAILN=10 item q_nf4_rows env OCTAVO_BNB4_CUDA_MAX_M=16 python benchmarks/quantized.py --methods bf16,nf4 --batches 2 4 8 16 --skip-w2 --json /tmp/res/q_nf4_rows.json
TAILN=12 item q_w8 python benchmarks/quantized.py --methods bf16,w8a16,fp8,fp8_block,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_w8.json
TAILN=8 item q_w8_wide env OCTAVO_GEMV_WIDE_GROUPS=1 python benchmarks/quantized.py --methods w8a16,fp8_block --batches 1 16 --skip-w2 --json /tmp/res/q_w8_wide.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
