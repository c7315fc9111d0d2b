. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=6 item t_staged python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_mma.py -k "staged or split_and_cta or exact_on_integer"
TAILN=14 item sweep python benchmarks/quantized_gemm.py --cuda-sweep --bits 4 --m 1 16 --stages 0 3 4 --json /tmp/res/sweep.json
TAILN=8 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 64 --skip-w2 --json /tmp/res/q_base.json
OCTAVO_SWAPAB_STAGES=4 TAILN=6 item q_p4 python benchmarks/quantized.py --methods w4a16 --batches 1 16 64 --skip-w2 --json /tmp/res/q_p4.json
OCTAVO_SWAPAB_STAGES=4 OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 OCTAVO_CUDA_KERNELS_MAX_M=16 TAILN=6 item q_p4_all16 python benchmarks/quantized.py --methods w4a16 --batches 1 16 32 64 --skip-w2 --json /tmp/res/q_p4_all16.json
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/test_device_upload.py tests/kernels/test_penalties.py tests/kernels/test_sample_race.py tests/test_sampler_profile.py tests/kernels/test_bnb4_gemm.py tests/kernels/test_bnb4_dequant_select.py
TAILN=8 item k_nf4_m16 python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --m 16 --kernels nf4_gemm nf4_dequant_select nf4_dequant_triton bf16_cublas --json /tmp/res/k_nf4_m16.json
echo "=== end $(date +%T)"
