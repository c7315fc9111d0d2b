# The next session's first device call (copy to .snap/, carry [".snap"]; about 7 minutes with
# its start). Session 60 cleared the GPU backlog; what it left is the decode attention at
# 16-32 requests: 541 us a step at 33% of HBM in the W4A16 batch-16 profile (Llama-8B shape,
# contexts ~284), 511 in bf16's. One layer's launch: 128 (request, KV head) pairs of ~3
# 128-key tiles on stream-K's 2 programs per SM (4 and 8 per SM were slower; the split-K
# path 1.4% faster at 16 requests, 0.4% slower at 32). This call sweeps the stream-K tile
# (BLOCK_N, WARPS, STAGES; default 128, 4, 3: 192 KB of K / V stages, one program per SM) on
# both shapes W4 and issue 12 use, then re-reads issue 15's figures on an H200.
# Turn on a tile only where it wins on both shapes (or make the rule shape-aware), with its
# kernel tests passing: python -m pytest -m gpu -q tests/kernels/test_paged_attention*.py.
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
for t in default 128,4,2 64,4,3 64,4,2 128,8,3 32,4,3; do
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
