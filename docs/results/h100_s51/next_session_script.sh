# The next session's first device calls (copy to .snap/, carry [".snap"]), about 12-14 minutes: run it as two calls with BUDGET=570 (item() skips what no longer fits; start the second call from the first skipped item).
# 1. W4A16 past 128 rows: batches 129-256 dequantize every weight to bf16 and call cuBLAS
#    (W2 0.85x bf16, batch 128 0.81x). The Triton swap-AB GEMM got 2 programs per SM past
#    16 rows in session 51 (gate_up 106.7 -> 105.0 us at 128 rows, down 69.3 -> 60.1):
#    whether it now beats dequantize-then-cuBLAS at 129-256 rows (OCTAVO_INT_SWAPAB_MAX_M=256)
#    in the engine and on W2, and its tiles at 256 rows.
# 2. Where W4A16's batch-32 step goes (1.38x bf16): qkv / o in CUDA chunks, gate_up / down in
#    the Triton swap-AB GEMM at 2 programs per SM.
# 3. Baselines on the machine of the call: W4 and W1.
# 0. FIRST: the logprob statistics kernel (written after session 51's device time; on by
#    default on CUDA for every request with logprobs): its GPU tests, then W1 --logprobs 5
#    against OCTAVO_LOGPROB_KERNEL=0 in the same call (session 51: 18,026 tok/s = 89.0% of
#    plain W1). If the tests fail, set logprob_kernel()'s default off (octavo/envs/sampling.py).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=3 item t_lp python -m pytest -m gpu -q -rf tests/kernels/test_logprob_stats.py tests/test_sampler_profile.py
TAILN=4 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
OCTAVO_LOGPROB_KERNEL=0 TAILN=4 item w1_lp_off python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp_off.json
TAILN=3 item t_route python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py
TAILN=10 item q_big python benchmarks/quantized.py --methods bf16,w4a16 --batches 128 256 --json /tmp/res/q_big.json
OCTAVO_INT_SWAPAB_MAX_M=256 TAILN=6 item q_big_swapab python benchmarks/quantized.py --methods w4a16 --batches 128 256 --json /tmp/res/q_big_swapab.json
TAILN=20 item sweep256 python benchmarks/quantized_gemm.py --sweep --paths swapab --bits 4 --m 256 --json /tmp/res/sweep256.json
OCTAVO_PDL=0 TAILN=14 item prof_l32 python benchmarks/profile_step.py --shape llama-3.1-8b --batch 32 --context 256 --quantization w4a16 --json /tmp/res/prof_l32.json
# dense_mma's plans at 16-32 rows since the split tiles' sums were fixed (Qwen3-0.6B batch 32:
# 786 us of a 1.8 ms step at ~33% of HBM; the plan was swept on an H200 in session 19).
TAILN=20 item dense_sweep python benchmarks/skinny_gemm.py --cuda-sweep --m 1 16 32 --json /tmp/res/dense_sweep.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
TAILN=4 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
echo "=== end $(date +%T)"
