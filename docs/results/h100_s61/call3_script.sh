# Session 61 call 3 (tree e7c7edb): the 8-bit CUDA decode kernel's plans per Llama-8B layer,
# then W8A16 with every layer in the swap-AB layout past 16 rows: the CUDA kernel in 16-row
# chunks, or dequantize-then-cuBLAS / the Triton large-batch GEMM, against the GEMV layout.
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=40 item sweep8 timeout 150 python benchmarks/quantized_gemm.py --cuda-sweep --bits 8 --m 1 16 --stages 0 3 --json /tmp/res/sweep8.json
export OCTAVO_INT_WEIGHT_LAYOUT=swapab
OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M=128 OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M=128 TAILN=2 item w8_chunk python benchmarks/quantized.py --methods w8a16 --batches 32 64 128 --skip-w2 --json /tmp/res/w8_chunk.json
OCTAVO_INT_SWAPAB_MAX_M=16 TAILN=2 item w8_max16 python benchmarks/quantized.py --methods w8a16 --batches 32 64 128 --skip-w2 --json /tmp/res/w8_max16.json
unset OCTAVO_INT_WEIGHT_LAYOUT
TAILN=2 item w8_def python benchmarks/quantized.py --methods w8a16 --batches 32 64 128 --skip-w2 --json /tmp/res/w8_def.json
TAILN=3 item w4_b16 python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 --skip-w2 --json /tmp/res/w4_b16.json
echo "=== end $(date +%T)"
