# The next session's first device call (copy to .snap/, carry [".snap"]). Session 44 ran block-
# scaled FP8 past the GEMV on an H100 only (calls 2-4) and the folded GEMV on an H200 (call 1).
# Here, on an H200 if one starts: the block-FP8 engine figures and W2 against bf16 and row fp8,
# the folded GEMV's plans for o / qkv / down (o at its default 8 x 512 plan ran 7.67 us against
# the row-scaled GEMV's 5.53), then W1 / W2 / W4 and issue 12's batch-1 / 16 figures, last
# re-measured on an H200 in session 39. Session 44's bitsandbytes 4-bit GEMV ran 10 GPU tests
# before a timeout cut its call: the whole bitsandbytes GPU file runs here first, then its
# two code tables (OCTAVO_BNB4_TABLE: 16, the default chosen by L1 lines a warp touches, against
# the 256 pairs the H100 timed).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=8 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_fp8_group_quant.py tests/kernels/test_fp8_block_gemv.py tests/quantization/test_fp8_blocks.py tests/quantization/test_compressed_tensors.py tests/kernels/test_bnb4_gemv.py tests/quantization/test_bitsandbytes.py
TAILN=8 item nf4 python benchmarks/gemv_scaling.py --k 4096 --n 4096 28672 --kernels bf16_cublas nf4_gemv nf4_gemv256 --json /tmp/res/nf4.json
F="fp8_gemv fp8_block_fold fp8_block_fold_16_512_4_1_2 fp8_block_fold_16_512_4_2_2 fp8_block_fold_16_512_4_1_3 fp8_block_fold_32_512_4_1_2 fp8_block_fold_16_1024_4_1_2 fp8_block_fold_32_256_4_2_2 fp8_block_fold_16_256_4_2_3"
TAILN=12 item fold_k4096 python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 --kernels $F --json /tmp/res/fold_k4096.json
TAILN=12 item fold_k14336 python benchmarks/gemv_scaling.py --k 14336 --n 2048 4096 --kernels $F --json /tmp/res/fold_k14336.json
TAILN=14 item q_block python benchmarks/quantized.py --methods bf16,fp8_block,fp8 --batches 1 2 4 16 64 256 --json /tmp/res/q_block.json
echo "=== end $(date +%T)"
