# The next session's first device call (copy to .snap/, carry [".snap"]; about 8 minutes with
# its start). First, on the CPU: `git am docs/results/h100_s57/split_sum_unrolled.patch` (the
# K-split sum with its splits unrolled, so every split's loads are in flight at once; tested
# under the interpreter, never run on a GPU: session 57's device time ran out), commit.
# Then, in order:
# 1. The GPU tests of the large-batch kernel, the sum and the routing, the fp16 form's
#    included (session 57 built it after its device time: float16 models, i.e. AutoAWQ /
#    AutoGPTQ checkpoints, behind OCTAVO_INT_LARGE_F16). If any fp16 test fails, the fp16
#    timings are skipped.
# 2. The layers at 128 / 256 rows in bf16 with the engine's form (session 57, call 1:
#    sum_only 8.1-9.9 us; down / qkv / o 38.5 / 24.2 / 20.5 us at 128 rows in the bf16 form,
#    68.2 / 43.3 / 29.0 at 256 in the float form), then in fp16 (the "engine" column is what
#    float16 models run today).
# 3. The engine against bf16 at batch 1 / 16 / 128 / 256 and W2 (session 57, H100: W4A16
#    2.12x / 1.96x / 0.96x / 0.78x, W2 0.91-0.93x).
# 3b. The same with OCTAVO_INT_LARGE_BF16_MATH=1: GPTQ / AWQ scales are fp16, so by default
#    bf16 models run the kernel's float form; forcing the bf16x2 form rounds each scale to
#    bf16 first (as Marlin-class kernels take them under bf16). Session 57, call 1: 14.347
#    ms (forced, last-CTA sum) against 14.419 (float, launch sum) at batch 256; the two
#    together were never run. If it wins clearly, weigh the default (scales rounded to bf16).
# 4. float16 models: bf16-method (unquantized fp16) and W4A16 without and with
#    OCTAVO_INT_LARGE_F16=1, batch 128 / 256 and W2. If the switch wins, turn it on.
# On an H200 (issue 15's figures were last read there in session 52), W1 and W4 too.
export BUDGET=${BUDGET:-500}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=8 item t_gpu timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_split_sum.py tests/kernels/test_swapab_wgmma.py tests/quantization/test_swapab_large.py -k "split_sum or launch_sum or routing or fp16"
TAILN=10 item g_sum timeout 90 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 128 256 --forms cuda_bf16_deep --split-sums launch --json /tmp/res/g_sum.json
F16=0
grep -q " passed" /tmp/res/t_gpu.log && ! grep -q "FAILED\|error" /tmp/res/t_gpu.log && F16=1
echo "fp16 form: $F16"
if [ $F16 = 1 ]; then
  TAILN=10 item g_f16 timeout 90 python benchmarks/large_int_gemm.py --dtype float16 --shapes gate_up down qkv o --m 128 256 --forms cuda cuda_bf16_deep --split-sums --json /tmp/res/g_f16.json
fi
TAILN=8 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 128 256 --json /tmp/res/q.json
OCTAVO_INT_LARGE_BF16_MATH=1 TAILN=4 item q_bf16x2 python benchmarks/quantized.py --methods w4a16 --batches 128 256 --json /tmp/res/q_bf16x2.json
TAILN=6 item q_f16 python benchmarks/quantized.py --dtype float16 --methods bf16,w4a16 --batches 128 256 --json /tmp/res/q_f16.json
if [ $F16 = 1 ]; then
  OCTAVO_INT_LARGE_F16=1 TAILN=4 item q_f16_on python benchmarks/quantized.py --dtype float16 --methods w4a16 --batches 128 256 --json /tmp/res/q_f16_on.json
fi
case "$GPU" in *H200*)
  TAILN=4 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out /tmp/res/w4.json ;;
esac
echo "=== end $(date +%T)"
