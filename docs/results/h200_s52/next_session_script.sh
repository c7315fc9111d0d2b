# The next session's first device call (copy to .snap/, carry [".snap"]), about 9-10 minutes
# (item times from session 52's H200 logs: W1 26-40 s, W2 35 s, quantized.py with W2 54-93 s).
# 1. The CUDA wide-tile 4-bit GEMM (octavo/kernels/swapab_wide.py, session 52, never run on a
#    GPU; off unless OCTAVO_SWAPAB_WIDE_MIN_M is set): its GPU tests, then per layer against
#    what the engine runs (dequantize + cuBLAS past 128 rows, Triton swap-AB 17-128) and bf16,
#    then W4A16 at 128 / 256 rows and W2 with it from 129 rows (session 52: W2 0.82x bf16,
#    batch 128 / 256 0.68x) and from 17 rows. If it wins, set the default in
#    int_weight_layout (envs.swapab_wide_min_m) from the per-layer table.
# 2. Issue 12's batch-1 / 16 / 64 figures on the H200 (session 51's W4A16 routing was
#    measured on H100s only: b1 2.10x, b16 1.91x).
# 3. W1 and W4 at main's head (session 52: W1 24,888-25,705 tok/s; W4 b1 0.812, b32 1.517).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item t_wide python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wide.py
TAILN=12 item g_wide python benchmarks/quantized_gemm.py --bits 4 --paths layout swapab swapab_dequant wide --m 32 64 128 256 --json /tmp/res/g_wide.json
TAILN=14 item wide_sweep python benchmarks/quantized_gemm.py --wide-sweep --m 64 128 256 --json /tmp/res/wide_sweep.json
TAILN=8 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 64 128 256 --json /tmp/res/q_base.json
OCTAVO_SWAPAB_WIDE_MIN_M=129 TAILN=6 item q_wide129 python benchmarks/quantized.py --methods w4a16 --batches 128 256 --json /tmp/res/q_wide129.json
OCTAVO_SWAPAB_WIDE_MIN_M=17 TAILN=6 item q_wide17 python benchmarks/quantized.py --methods w4a16 --batches 64 128 256 --skip-w2 --json /tmp/res/q_wide17.json
TAILN=12 item q_small python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_small.json
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
