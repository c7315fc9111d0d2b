# The next session's first device call (copy to .snap/, carry [".snap"]; about 6 minutes with
# its start). First, on the CPU: `git am docs/results/h100_s57/split_sum_unrolled.patch` (the
# K-split sum with its splits unrolled, so every split's loads are in flight at once; tested
# under the interpreter, never run on a GPU: session 57's device time ran out), commit.
# In order: the sum's GPU tests and the launch-sum bit-equality tests; the layers at 128 / 256
# rows with the engine's form (sum_only was 8.1-9.9 us in session 57's call 1, the
# layers down / qkv / o 38.5 / 24.2 / 20.5 us at 128 rows and 68.2 / 43.3 / 29.0 at 256 in
# the float form); the engine against bf16 at batch 1 / 16 / 128 / 256 and W2 (session 57,
# H100: W4A16 2.12x / 1.96x / 0.96x / 0.78x, W2 0.91-0.93x). On an H200 (issue 15's figures
# were last read there in session 52), W1 and W4 too.
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=6 item t_sum timeout 90 python -m pytest -m gpu -q -rf tests/kernels/test_split_sum.py tests/kernels/test_swapab_wgmma.py -k "split_sum or launch_sum or routing"
TAILN=10 item g_sum timeout 90 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 128 256 --forms cuda_bf16_deep --split-sums launch --json /tmp/res/g_sum.json
TAILN=8 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 128 256 --json /tmp/res/q.json
case "$GPU" in *H200*)
  TAILN=4 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out /tmp/res/w4.json ;;
esac
echo "=== end $(date +%T)"
