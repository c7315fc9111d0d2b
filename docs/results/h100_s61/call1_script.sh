# The next session's first device call (copy to .snap/, carry [".snap"]; about 8-9 minutes
# with its start). Session 60 cleared the GPU backlog; what it left is the decode attention at
# 16-32 requests: 541 us a step at 33% of HBM in the W4A16 batch-16 profile (Llama-8B shape,
# contexts ~284), 511 in bf16's. One layer's launch: 128 (request, KV head) pairs of ~3
# 128-key tiles on stream-K's 2 programs per SM (4 and 8 per SM were slower; the split-K
# path 1.4% faster at 16 requests, 0.4% slower at 32). This call sweeps the stream-K tile
# (BLOCK_N, WARPS, STAGES; default 128, 4, 3 past one pair per SM, 64, 4, 3 up to it) on
# both shapes W4 and issue 12 use at 16 / 32 requests, then re-reads issue 15's figures on
# an H200. "default" below is the rule; the others force one tile on both batch sizes.
# Since 2fcb6ce a launch of at most one pair per SM takes 64-key tiles by default (calls 6-7:
# Llama-8B W4A16 batch 16 3.347 -> 3.231 ms, Qwen3-0.6B batch 8 1.152 -> 1.133; one run each,
# under OCTAVO_ATTN_STREAMK_TILE=64,4,3); its GPU test (test_small_grid_shape) has never run:
# it runs first here. If it fails, revert 2fcb6ce before anything else.
# Turn on a tile only where it wins on both shapes (or make the rule shape-aware), with its
# kernel tests passing.
export BUDGET=${BUDGET:-560}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=6 item t_attn timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_paged_attention_streamk.py tests/kernels/test_paged_attention.py
# One request keeps the split parts and their merge launch (session 28, H200, Qwen3-0.6B:
# 0.886 against stream-K's 0.950 ms, at 128-key tiles); stream-K now takes 64-key tiles
# there, and the merge launch is 73 us of the W4A16 batch-1 step (call 4). Stream-K forced:
for s in 0 1; do
  OCTAVO_ATTN_STREAMK=$s TAILN=1 item "b1_w4a16_sk$s" python benchmarks/quantized.py --methods w4a16 --batches 1 --skip-w2 --json "/tmp/res/b1_w4a16_sk$s.json"
  OCTAVO_ATTN_STREAMK=$s TAILN=2 item "b1_qwen_sk$s" python benchmarks/latency.py --batch-sizes 1 --repeat 3 --json-out "/tmp/res/b1_qwen_sk$s.json"
done
TAILN=3 item w8_default python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/w8_default.json
OCTAVO_INT_SWAPAB_8BIT=1 TAILN=2 item w8_swapab8 python benchmarks/quantized.py --methods w8a16 --batches 1 16 --skip-w2 --json /tmp/res/w8_swapab8.json
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item w8_swapab_all python benchmarks/quantized.py --methods w8a16 --batches 1 16 --skip-w2 --json /tmp/res/w8_swapab_all.json
for t in default 128,4,3 64,4,2 32,4,3 64,8,3; do
  if [ $t = default ]; then unset OCTAVO_ATTN_STREAMK_TILE; else export OCTAVO_ATTN_STREAMK_TILE=$t; fi
  TAILN=1 item "w4a16_$t" python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json "/tmp/res/w4a16_$t.json"
  TAILN=3 item "qwen_$t" python benchmarks/latency.py --batch-sizes 16,32 --repeat 2 --json-out "/tmp/res/qwen_$t.json"
done
unset OCTAVO_ATTN_STREAMK_TILE
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json ;;
esac
echo "=== end $(date +%T)"
