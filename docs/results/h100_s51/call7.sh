. scripts/device_items.sh
TAILN=3 item t_chunks python -m pytest -m gpu -q -rf tests/kernels/test_swapab_mma.py tests/quantization/test_int_weight_layout.py -k "past_16_rows or 16_row_launches or writes_into_rows or every_batch"
TAILN=4 item q_chunk_small python benchmarks/quantized.py --methods w4a16 --batches 32 64 --skip-w2 --json /tmp/res/q_chunk_small.json
OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M=64 TAILN=4 item q_chunk_large python benchmarks/quantized.py --methods w4a16 --batches 32 64 --skip-w2 --json /tmp/res/q_chunk_large.json
echo "=== end $(date +%T)"
