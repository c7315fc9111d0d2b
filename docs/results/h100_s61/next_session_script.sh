# The next session's first device call (copy to .snap/, carry [".snap"]; about 8-9 minutes
# with its start). Session 61 left two unmeasured pieces for W8A16 (Llama-8B shape):
# - b2f1243: the Triton swap-AB GEMM (17-128 rows of a layer in the swap-AB layout) makes bf16
#   8-bit operands as q - 128 by two LOP3 and one bf16x2 FMA, not a widening int16 -> bf16
#   conversion per weight (sm_90 SASS: hot loop 705 -> 492 instructions, 128 I2F gone). In
#   session 61 W8A16 with every layer swap-AB lost there: batch 32 / 64 / 128 11.525 (MAX_M
#   16) / 10.191 / 14.412 ms against the GEMV layout's 6.152 / 6.935 / 11.346;
# - e7c7edb: the gated store at 8 bits (measured: batch 1 3.643 -> 3.618 ms, its GPU tests pass).
# If the swap-AB layout now wins or ties at every batch and W2, make it 8-bit's default on
# Hopper where the CUDA kernel is built (int_weight_layout.choose: the 4-bit size rule for
# 8-bit too, keeping the rows layout for one group per row), then re-read issue 12's table.
# Its GPU tests run first: if they fail, revert b2f1243.
export BUDGET=${BUDGET:-520}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=4 item t_swapab timeout 150 python -m pytest -m gpu -q -rf tests/quantization/test_w4a16_swapab.py
TAILN=3 item w8_def python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 32 64 128 256 --json /tmp/res/w8_def.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item w8_sw python benchmarks/quantized.py --methods w8a16 --batches 1 16 32 64 128 256 --json /tmp/res/w8_sw.json
# Per-layer plans of the CUDA decode kernel in the engine (OCTAVO_SWAPAB_LAYER_PLAN, 74c361f),
# from session 61's hot-weight sweeps (calls 3-4): 4-bit qkv 16 warps per SM + 3 stages
# (7.60 -> 7.05 us), o 4 warps (6.52 -> 6.05); 8-bit gate_up 16 warps (48.7 -> 44.0), o 12 + 3.
# A per-layer plan becomes a default only where it wins here (default first, same call).
Q=4096,6144,4; O=4096,4096,4
TAILN=1 item w4_plan_def python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_def.json
OCTAVO_SWAPAB_LAYER_PLAN="$Q=16/3" TAILN=1 item w4_plan_q python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_q.json
OCTAVO_SWAPAB_LAYER_PLAN="$O=4/3" TAILN=1 item w4_plan_o python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_o.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab OCTAVO_SWAPAB_LAYER_PLAN="4096,28672,8=16;4096,4096,8=12/3" TAILN=1 item w8_sw_plan python benchmarks/quantized.py --methods w8a16 --batches 1 8 --skip-w2 --json /tmp/res/w8_sw_plan.json
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=6 item q python benchmarks/quantized.py --json /tmp/res/q.json ;;
esac
echo "=== end $(date +%T)"
