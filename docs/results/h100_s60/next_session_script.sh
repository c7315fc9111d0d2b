# The next session's first device call (copy to .snap/, carry [".snap"]; about 7 minutes with
# its start). Session 60 cleared the GPU backlog; what it left is the decode attention at
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
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAILN=6 item t_attn timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_paged_attention_streamk.py tests/kernels/test_paged_attention.py
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
