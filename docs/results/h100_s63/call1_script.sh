# The next session's first device call (copy to .snap/, carry [".snap"]; about 7-9 minutes
# with its start). Session 62 ended at HEAD with two unmeasured-as-committed pieces, both
# measured through switches that give the same launches:
# - 690ee07: 8-bit gated launches of 1-8 rows at 16 warps per SM (measured via
#   OCTAVO_SWAPAB_LAYER_PLAN="4096,28672,8=16": W8A16 b1 / b8 3.608 / 3.886 -> 3.434 / 3.743);
# - 2e22537: 8-bit layers in the swap-AB layout for max_num_seqs <= 32 (measured via
#   OCTAVO_INT_WEIGHT_LAYOUT=swapab at b24 / b32).
# On an H200: issue 12's full table and W1 first (no H200 since session 52).
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=4 item t_mma timeout 200 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py tests/quantization/test_int_weight_layout.py
case "$GPU" in *H200*)
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json ;;
esac
TAILN=3 item w8_mns32 python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 8 16 32 --skip-w2 --max-num-seqs 32 --json /tmp/res/w8_mns32.json
TAILN=2 item w8_def python benchmarks/quantized.py --methods w8a16 --batches 1 8 16 32 --skip-w2 --json /tmp/res/w8_def.json
# W8A16 batch 1 needs ~95 us more for 1.6x (3.434 -> 3.34 ms): qkv (8-bit: 192 tiles, so the
# registers' pipeline by default) with 3 stages, as o and down have.
OCTAVO_SWAPAB_LAYER_PLAN="4096,6144,8=6/3" TAILN=2 item w8_qkv_p3 python benchmarks/quantized.py --methods w8a16 --batches 1 8 --skip-w2 --max-num-seqs 16 --json /tmp/res/w8_qkv_p3.json
echo "=== end $(date +%T)"
