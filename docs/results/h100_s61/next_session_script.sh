# The next session's first device call (copy to .snap/, carry [".snap"]; about 6-7 minutes
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
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=4 item t_swapab timeout 150 python -m pytest -m gpu -q -rf tests/quantization/test_w4a16_swapab.py
TAILN=3 item w8_def python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 32 64 128 256 --json /tmp/res/w8_def.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item w8_sw python benchmarks/quantized.py --methods w8a16 --batches 1 16 32 64 128 256 --json /tmp/res/w8_sw.json
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=6 item q python benchmarks/quantized.py --json /tmp/res/q.json ;;
esac
echo "=== end $(date +%T)"
