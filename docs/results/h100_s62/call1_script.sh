# Session 62, call 1 (tree 15950a6 + this script): session 61's unmeasured pieces and this
# session's 8-bit layout rule. On an H200 the H200-only figures (issue 12's table, W1) first.
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
# b2f1243 (the Triton swap-AB GEMM's bf16 8-bit operands as q - 128): its GPU tests first.
TAILN=4 item t_swapab timeout 150 python -m pytest -m gpu -q -rf tests/quantization/test_w4a16_swapab.py tests/quantization/test_int_weight_layout.py
case "$GPU" in *H200*)
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json ;;
esac
# 7e0cf18: W8A16 with max_num_seqs 16 takes the swap-AB layout by itself (no env).
TAILN=3 item w8_mns16 python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 --skip-w2 --max-num-seqs 16 --json /tmp/res/w8_mns16.json
# The 17-128-row range, where W8A16's swap-AB layout lost in session 61 (now b2f1243).
TAILN=2 item w8_def_mid python benchmarks/quantized.py --methods w8a16 --batches 32 64 128 --skip-w2 --json /tmp/res/w8_def_mid.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item w8_sw_mid python benchmarks/quantized.py --methods w8a16 --batches 32 64 128 --skip-w2 --json /tmp/res/w8_sw_mid.json
Q=4096,6144,4; O=4096,4096,4
TAILN=1 item w4_plan_def python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_def.json
OCTAVO_SWAPAB_LAYER_PLAN="$Q=16/3" TAILN=1 item w4_plan_q python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_q.json
OCTAVO_SWAPAB_LAYER_PLAN="$O=4/3" TAILN=1 item w4_plan_o python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_o.json
OCTAVO_SWAPAB_LAYER_PLAN="$Q=6/4;$O=6/4" TAILN=1 item w4_plan_p4 python benchmarks/quantized.py --methods w4a16 --batches 1 8 --skip-w2 --json /tmp/res/w4_plan_p4.json
OCTAVO_SWAPAB_LAYER_PLAN="4096,28672,8=16;4096,4096,8=12/3" TAILN=1 item w8_mns16_plan python benchmarks/quantized.py --methods w8a16 --batches 1 16 --skip-w2 --max-num-seqs 16 --json /tmp/res/w8_mns16_plan.json
echo "=== end $(date +%T)"
