# The next session's first device call (copy to .snap/, carry [".snap"]). Session 45 ran its
# final FP8 code (c0a2b51: unit-scaled cuBLAS up to 128 rows, the one-step quantizer) on an
# H100 only (calls 4-5); here the same figures on an H200 if one starts. Then the experiment
# session 45 had no device time left for: large-batch W4A16 dequantized in N-chunks that might
# stay in L2 (benchmarks/chunked_dequant.py; W2 with W4A16 is at 0.84x bf16, target 0.9x),
# the gated activation in the unit-scaled GEMM's epilogue (OCTAVO_FP8_UNIT_GLU, off until
# measured here: one launch fewer per layer at 9-128 rows), block FP8 at one row with o's own
# folded plan (session 45 call 1: 2.759 ms at batch 1 before it), a CUDA C++ NF4 GEMV
# (OCTAVO_BNB4_CUDA, off: codes in shared memory, 4 sm_90 instructions a weight against the
# Triton GEMV's 9, which reads at 7-9% of HBM), and the issue 12 / 15 figures last
# read on an H200 in session 39. More than one call's 570 s: item() skips what the budget leaves
# out; run the rest in a second call.
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=20 item chunked python benchmarks/chunked_dequant.py --json /tmp/res/chunked.json
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_outer_scale.py tests/kernels/test_bnb4_cuda.py
TAILN=12 item nf4 python benchmarks/gemv_scaling.py --k 4096 --n 4096 28672 --kernels bf16_cublas nf4_gemv256 nf4_cuda nf4_cuda_r8 nf4_cuda_r32 nf4_cuda_r128 --json /tmp/res/nf4.json
TAILN=4 item q_nf4 python benchmarks/quantized.py --methods bf16,nf4 --batches 1 2 --skip-w2 --json /tmp/res/q_nf4.json
OCTAVO_BNB4_CUDA=1 TAILN=4 item q_nf4_cuda python benchmarks/quantized.py --methods nf4 --batches 1 2 --skip-w2 --json /tmp/res/q_nf4_cuda.json
TAILN=8 item q_fp8 python benchmarks/quantized.py --methods bf16,fp8 --batches 16 64 128 256 --json /tmp/res/q_fp8.json
OCTAVO_FP8_UNIT_GLU=1 TAILN=4 item q_fp8_glu python benchmarks/quantized.py --methods fp8 --batches 16 64 128 --skip-w2 --json /tmp/res/q_fp8_glu.json
TAILN=6 item q_block1 python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 2 --skip-w2 --json /tmp/res/q_block1.json
TAILN=10 item q12 python benchmarks/quantized.py --methods bf16,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q12.json
TAILN=6 item w1 python benchmarks/throughput.py --workload W1
TAILN=6 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
