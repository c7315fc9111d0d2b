# The next session's first device call (copy to .snap/, carry [".snap"]; about 9 minutes with
# its start). Session 58 prepared it and no device machine started for it. Three pieces have
# never run on a GPU:
# - the unrolled K-split sum (split_sum.py, on main since 5dee2ed: the default launch sum's
#   second launch; interpreter-tested);
# - the fp16 form of the large-batch kernel (OCTAVO_INT_LARGE_F16, off; session 57);
# - the gated decode store (OCTAVO_SWAPAB_GLU, off; session 58): Llama-8B's gate_up at 1-16
#   rows writes silu(gate) * up from swapab_mma's store, the activation's launch gone;
# - the rotary decode store (OCTAVO_SWAPAB_ROPE, off; session 58): the 4-bit qkv at 1-16 rows
#   rotates q / k and writes k / v into the paged cache from the same kernel's store.
# In order:
# 1. Their GPU tests (with the routing and launch-sum tests). A failing fp16 test skips the
#    fp16 timings; a failing gated-store test skips q_glu. If a split_sum test fails, revert
#    5dee2ed before anything else (it is the default path past 64 rows).
# 2. The engine, bf16 against W4A16 at batch 1 / 16 / 128 / 256 and W2 (session 57, H100:
#    2.12x / 1.96x / 0.96x / 0.78x, W2 0.91-0.93x), then W4A16 batch 1 / 16 with
#    OCTAVO_SWAPAB_GLU=1, OCTAVO_SWAPAB_ROPE=1 and both (against q's W4A16 column: turn on
#    what wins; the estimate is 32 launches a step each, about 2%).
# 3. OCTAVO_INT_LARGE_BF16_MATH=1 (bf16x2 with GPTQ's fp16 scales rounded to bf16, never run
#    with the launch sum), the layers at 128 / 256 rows (the unrolled sum's sum_only against
#    session 57's 8.1-9.9 us), float16 models with OCTAVO_INT_LARGE_F16 off and on.
# On an H200 (issue 15's figures were last read there in session 52), W1 and W4 too.
export BUDGET=${BUDGET:-570}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=8 item t_gpu timeout 270 python -m pytest -m gpu -q -rf tests/kernels/test_split_sum.py tests/kernels/test_swapab_wgmma.py tests/quantization/test_swapab_large.py tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_rope.py -k "split_sum or launch_sum or routing or fp16 or glu or gated or blocked or rope or rotary"
F16=0
grep -q " passed" /tmp/res/t_gpu.log && ! grep -v test_swapab_glu /tmp/res/t_gpu.log | grep -q "FAILED\|error" && F16=1
echo "fp16 form: $F16"
TAILN=8 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 128 256 --json /tmp/res/q.json
GLU=0
grep -q "test_swapab_glu.*FAILED\|test_swapab_glu.*ERROR" /tmp/res/t_gpu.log || GLU=1
ROPE=0
grep -q "test_swapab_rope.*FAILED\|test_swapab_rope.*ERROR" /tmp/res/t_gpu.log || ROPE=1
echo "glu: $GLU rope: $ROPE"
if [ $GLU = 1 ]; then
  OCTAVO_SWAPAB_GLU=1 TAILN=4 item q_glu python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_glu.json
fi
if [ $ROPE = 1 ]; then
  OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_rope python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_rope.json
fi
if [ $GLU = 1 ] && [ $ROPE = 1 ]; then
  OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_both python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_both.json
fi
OCTAVO_INT_LARGE_BF16_MATH=1 TAILN=4 item q_bf16x2 python benchmarks/quantized.py --methods w4a16 --batches 128 256 --json /tmp/res/q_bf16x2.json
TAILN=10 item g_sum timeout 90 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 128 256 --forms cuda_bf16_deep --split-sums launch --json /tmp/res/g_sum.json
TAILN=6 item q_f16 python benchmarks/quantized.py --dtype float16 --methods bf16,w4a16 --batches 128 256 --json /tmp/res/q_f16.json
if [ $F16 = 1 ]; then
  OCTAVO_INT_LARGE_F16=1 TAILN=4 item q_f16_on python benchmarks/quantized.py --dtype float16 --methods w4a16 --batches 128 256 --json /tmp/res/q_f16_on.json
fi
if [ $F16 = 1 ]; then
  TAILN=10 item g_f16 timeout 90 python benchmarks/large_int_gemm.py --dtype float16 --shapes gate_up down qkv o --m 128 256 --forms cuda cuda_bf16_deep --split-sums --json /tmp/res/g_f16.json
fi
if [ $GLU = 1 ]; then  # the batch-1 step's kernels with the gated store (session 51's table)
  OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=$ROPE OCTAVO_PDL=0 TAILN=14 item p_glu python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 1 --context 256 --json /tmp/res/p_glu.json
fi
case "$GPU" in *H200*)
  TAILN=4 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out /tmp/res/w4.json ;;
esac
echo "=== end $(date +%T)"
