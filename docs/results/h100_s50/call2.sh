. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=5 item t_rule python -m pytest -m gpu -q -rf tests/kernels/test_swapab_mma.py -k "engine_decode or strided_rows or exact_on_integer or without_cta_splits"
TAILN=8 item q_w4 python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 64 --skip-w2 --json /tmp/res/q_w4.json
OCTAVO_SWAPAB_STAGES=0 TAILN=4 item q_w4_p0 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_w4_p0.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=5 item q_c python benchmarks/quantized.py --methods w4a16 --batches 1 16 64 --skip-w2 --json /tmp/res/q_c.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=5 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
TAILN=4 item e_nf4 python benchmarks/quantized.py --methods nf4 --batches 16 64 --skip-w2 --json /tmp/res/e_nf4.json
OCTAVO_BNB4_GEMM_MAX_M=64 TAILN=4 item e_nf4_gemm python benchmarks/quantized.py --methods nf4 --batches 16 64 --skip-w2 --json /tmp/res/e_nf4_gemm.json
TAILN=8 item k_nf4_m64 python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --m 64 --kernels nf4_gemm nf4_dequant_select nf4_dequant_triton bf16_cublas --json /tmp/res/k_nf4_m64.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
