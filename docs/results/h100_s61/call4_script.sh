# Session 61 call 4 (tree e7c7edb): issue 12's table at this session's defaults (all methods,
# one run), the 4-bit CUDA decode kernel's plans per Llama-8B layer at 1 / 8 rows, and W4A16
# batch 1 / 8 at other warps per SM (every swap-AB CUDA launch, the gated one included).
export BUDGET=${BUDGET:-400}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item table python benchmarks/quantized.py --json /tmp/res/table.json
TAILN=10 item sweep4 timeout 100 python benchmarks/quantized_gemm.py --cuda-sweep --bits 4 --m 1 8 --stages 0 3 --json /tmp/res/sweep4.json
for w in 6 8 12 16; do
  OCTAVO_SWAPAB_WARPS_PER_SM=$w TAILN=1 item "w4_warps$w" python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json "/tmp/res/w4_warps$w.json"
done
echo "=== end $(date +%T)"
