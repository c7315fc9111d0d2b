# Session 60's third call: issue 12's whole table with the new defaults (gated store to 8 rows,
# bf16x2 / half2 large-batch dequantization, the fp16 form), and on an H200 issue 15's W1 / W2 /
# W4 (last read there in session 52).
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=4 item t_gpu timeout 120 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py
TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
  TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out /tmp/res/w4.json ;;
esac
echo "=== end $(date +%T)"
