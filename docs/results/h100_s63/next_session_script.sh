# The next session's first device call (copy to .snap/, carry [".snap"]; about 6-9 minutes
# with its start). Session 63 left nothing unmeasured as committed; no H200 has been offered
# since session 52, and issue 12 / 15's targets are set for one.
# - Any card: the GPU tests of the files session 63 touched (the 8-bit routing past 32 rows).
# - On an H200: issue 12's full table (W8A16 now in the swap-AB layout by default), W1, W2.
# - On an H100: W8A16's table row and W2 against bf16 in one call (session 63 read bf16's W2
#   in another call than the committed W8A16's).
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -f /tmp/res/*
TAILN=3 item t_layout timeout 150 python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py
case "$GPU" in
  *H200*)
    TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json
    TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
    TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json ;;
  *)
    TAILN=3 item q8 python benchmarks/quantized.py --methods bf16,w8a16 --json /tmp/res/q8.json ;;
esac
echo "=== end $(date +%T)"
