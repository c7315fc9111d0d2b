# Session 60's sixth call (the last 240 s): the stream-K decode tile at W4A16 batch 16 / 32.
export BUDGET=${BUDGET:-140}
. scripts/device_items.sh
for t in default 64,4,3 128,8,3 128,4,2; do
  if [ $t = default ]; then unset OCTAVO_ATTN_STREAMK_TILE; else export OCTAVO_ATTN_STREAMK_TILE=$t; fi
  TAILN=1 item "t_$t" python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json "/tmp/res/t_$t.json"
done
echo "=== end $(date +%T)"
