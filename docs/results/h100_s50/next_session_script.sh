# The next session's first device calls (copy to .snap/, carry [".snap"]). About 12-15 minutes in all: run it as two calls (item() skips what the first call's budget no longer fits; start the second from there). The tests come first: session 50 changed the CUDA kernels' split-tile epilogue and added the chunked grid after its device time.
# 1. The one 240-320 ms decode step left in W1 with penalties or logprobs (session 50): the
#    slowest steps now print their index and schedule / execute / output split.
# 2. Whether qkv / o can take the swap-AB layout without losing batches of 17-128 rows:
#    session 50's routing "c" (every 4-bit layer swap-AB, the CUDA kernel to 16 rows on
#    qkv / o) gave batch 16 1.65x bf16 against the default's 1.54x but batch 64 0.84x against
#    0.94x; the Triton swap-AB GEMM's tiles for qkv / o at 32-128 rows were never swept.
#    OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M=128 runs qkv / o past 16 rows as 16-row CUDA launches
#    (weights from L2 after the first): if q_c_chunked keeps batch 16's gain and loses
#    nothing at 32-128 against q_base, make routing c with chunks the default.
#    Routing c with the stages rule (2.791 ms at batch 1, session 50 call 2) ran slower than
#    session 49's c with the registers' pipeline everywhere (2.656) and call 1's c with 4
#    stages everywhere (2.609): different calls, so q_c_p0 / p3 / p4 settle it in one.
#    The split tiles' last-CTA sums now load a split's partials at once (one L2 round trip a
#    split, not one an output): W4 (session 50: batch 1 0.918 ms, batch 32 1.678) and the
#    Qwen3 batch-32 profile (session 49: dense_mma 811.9 us a step) show what it moved.
# 3. The NF4 GEMM at 17-32 rows (default takes up to 16; at 64 it lost).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python -c "import torch; from octavo.kernels import swapab_mma as s; d=torch.device('cuda'); print('CTA shared limit', getattr(torch.cuda.get_device_properties(d), 'shared_memory_per_block_optin', None), s._shared_limit(d), 'staged warps m1 p3', s.staged_warps(1, 4, 4, 3, 8, s._shared_limit(d)))"
# Session 50's GPU-only test written after its device time: no race-kernel compile after the profile.
TAILN=4 item t_profile python -m pytest -m gpu -q -rf tests/test_sampler_profile.py tests/quantization/test_int_weight_layout.py tests/kernels/test_swapab_mma.py -k "sampler or no_draw or 16_row_launches or writes_into_rows or past_16_rows or matches_the_float64 or split_and_cta"
TAILN=4 item t_dense python -m pytest -m gpu -q -rf tests/kernels/test_dense_mma.py tests/kernels/test_dense_mma_fp8.py
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
OCTAVO_PDL=0 TAILN=14 item prof_q32 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 32 --context 256 --json /tmp/res/prof_q32.json
TAILN=6 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=9 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=9 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
TAILN=8 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 32 64 128 --skip-w2 --json /tmp/res/q_base.json
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
