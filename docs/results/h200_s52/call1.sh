. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item t_lp python -m pytest -m gpu -q -rf -x tests/kernels/test_logprob_stats.py tests/test_sampler_profile.py tests/kernels/test_dense_mma.py
TAILN=4 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
OCTAVO_LOGPROB_KERNEL=0 TAILN=4 item w1_lp_off python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp_off.json
TAILN=4 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
OCTAVO_CUDA_DENSE_MAX_M=64 TAILN=4 item w1_d64 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1_d64.json
TAILN=30 item dense64 python benchmarks/skinny_gemm.py --paths cublas cuda --m 16 32 40 48 64 --json /tmp/res/dense64.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
TAILN=10 item q_big python benchmarks/quantized.py --methods bf16,w4a16 --batches 128 256 --json /tmp/res/q_big.json
echo "=== end $(date +%T)"
