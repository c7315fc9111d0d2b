# Session 47 call 2 (short): the CUDA NF4 GEMV with AHEAD rows a warp in flight (1 / 4 / 8)
# at 4 rows of x against dequantize-then-cuBLAS, then at one row, then its GPU tests.
export BUDGET=${BUDGET:-270}
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=14 item gemv_m4 python benchmarks/gemv_scaling.py --k 4096 --n 4096 28672 --m 4 --kernels nf4_dequant nf4_cuda_a1 nf4_cuda_a4 nf4_cuda_a8 --json /tmp/res/gemv_m4.json
TAILN=12 item gemv_m1 python benchmarks/gemv_scaling.py --k 4096 --n 4096 28672 --m 1 --kernels nf4_cuda_a1 nf4_cuda_a4 nf4_cuda_a8 --json /tmp/res/gemv_m1.json
TAILN=4 item gpu_tests env OCTAVO_BNB4_CUDA_MAX_M=16 python -m pytest -m gpu -q -x -rf tests/kernels/test_bnb4_cuda.py -k "not 28672 and not 14336 and not 8960"
echo "=== end $(date +%T)"
