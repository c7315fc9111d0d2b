# The next session's first device call (copy to .snap/, carry [".snap"]). It re-reads issue
# 12 / 15's figures at HEAD and the two leads session 49 left (docs/benchmarks.md, session 49):
# W1 with penalties against plain W1 in the same call, and W4A16 with every 4-bit layer in the
# swap-AB layout at 1-256 rows, beside the default and bf16. For an A/B against an older
# tree: `git archive <commit> octavo | tar -x -C .snap/old`, then PYTHONPATH=.snap/old:.
# (since session 49 the benchmarks put their checkout after PYTHONPATH's entries; before,
# it came first and such "old tree" runs ran the current code).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
# About 9-10 minutes in all: run it as two calls if the first stops short (item() skips what
# the budget no longer fits, and says so).
# Session 49's CUDA-only paths (logprobs / prompt logprobs copied to pinned memory, the
# sampler profile at start-up) ran only on the CPU: the async tests on the GPU first.
TAILN=4 item async_tests python -m pytest -q -rf tests/test_async_scheduling.py tests/test_penalty_rows.py tests/test_logits_processors.py tests/test_prompt_logprobs_slices.py
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/test_device_upload.py tests/kernels/test_penalties.py tests/kernels/test_sample_race.py tests/kernels/test_swapab_mma.py tests/test_sampler_profile.py tests/kernels/test_bnb4_gemm.py tests/kernels/test_bnb4_dequant_select.py tests/quantization/test_bitsandbytes.py
# Session 49's NF4 builds (select-decoded codes, no gathers), kernel then engine. Flip
# envs.bnb4_gemm_max_m's default to the rows where the GEMM beats dequantize-then-cuBLAS, and
# OCTAVO_BNB4_DEQUANT's to select if it beats the table.
for m in 16 64 256; do
  TAILN=8 item k_nf4_m$m python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --m $m --kernels nf4_gemm nf4_dequant_select nf4_dequant_triton bf16_cublas --json /tmp/res/k_nf4_m$m.json
done
OCTAVO_BNB4_GEMM_MAX_M=256 TAILN=8 item e_nf4_gemm python benchmarks/quantized.py --methods bf16,nf4 --batches 4 16 64 256 --skip-w2 --json /tmp/res/e_nf4_gemm.json
OCTAVO_BNB4_DEQUANT=select TAILN=4 item e_nf4_select python benchmarks/quantized.py --methods nf4 --batches 16 256 --skip-w2 --json /tmp/res/e_nf4_select.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
# Sampled logprobs no longer make the engine synchronous (session 49, after its device time):
TAILN=5 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
TAILN=10 item q_base python benchmarks/quantized.py --methods bf16,w4a16,w8a16,fp8 --batches 1 16 64 256 --skip-w2 --json /tmp/res/q_base.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=6 item q_small16 python benchmarks/quantized.py --methods w4a16 --batches 1 16 32 64 128 --skip-w2 --json /tmp/res/q_small16.json
OCTAVO_PDL=0 OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_CUDA_KERNELS_SMALL_MAX_M=16 TAILN=30 item prof_small64 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 64 --context 128 --json /tmp/res/prof_small64.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
