# Session 63 call 2: can 8-bit layers stay in the swap-AB layout at every batch (so W8A16's
# batch-1 1.55x holds at max_num_seqs 256)? Per-layer 8-bit paths at 16-256 rows, then the
# engine at 48-256 rows under the candidate routings, against the default (GEMV / along-K).
export BUDGET=${BUDGET:-560}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
rm -f /tmp/res/*
M="16 32 48 64 96 128 256"
TAILN=40 item g8 python benchmarks/quantized_gemm.py --bits 8 --m $M --paths default swapab layout swapab_dequant --json /tmp/res/g8.json
OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M=128 OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M=128 TAILN=20 item g8_chunk python benchmarks/quantized_gemm.py --bits 8 --m 32 48 64 96 128 --paths layout --json /tmp/res/g8_chunk.json
OCTAVO_INT_SWAPAB_MAX_M=32 TAILN=20 item g8_large python benchmarks/quantized_gemm.py --bits 8 --m 48 64 96 128 256 --paths layout --json /tmp/res/g8_large.json
B="--methods w8a16 --batches 32 48 64 128 256 --skip-w2"
TAILN=2 item e_def python benchmarks/quantized.py $B --json /tmp/res/e_def.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item e_sw python benchmarks/quantized.py $B --json /tmp/res/e_sw.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_SWAPAB_CUDA_CHUNKED_MAX_M=128 OCTAVO_SWAPAB_CUDA_CHUNKED_LARGE_MAX_M=128 TAILN=2 item e_sw_chunk python benchmarks/quantized.py $B --json /tmp/res/e_sw_chunk.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_INT_SWAPAB_MAX_M=32 TAILN=2 item e_sw_large python benchmarks/quantized.py $B --json /tmp/res/e_sw_large.json
TAILN=12 item sw8_sweep timeout 110 python benchmarks/quantized_gemm.py --sweep --swapab-only --bits 8 --m 48 128 --paths swapab --json /tmp/res/sw8_sweep.json
echo "=== end $(date +%T)"
