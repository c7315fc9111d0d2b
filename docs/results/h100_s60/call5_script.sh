# Session 60's fifth call: batch 16's decode attention (540 us a step, 33% of HBM, in the
# W4A16 profile): stream-K's programs per SM and the split-K path instead, W4A16 batch 16 / 32.
export BUDGET=${BUDGET:-270}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=1 item a_w2 python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json /tmp/res/a_w2.json
OCTAVO_ATTN_STREAMK_WAVES=4 TAILN=1 item a_w4 python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json /tmp/res/a_w4.json
OCTAVO_ATTN_STREAMK_WAVES=8 TAILN=1 item a_w8 python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json /tmp/res/a_w8.json
OCTAVO_ATTN_STREAMK=0 TAILN=1 item a_split python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json /tmp/res/a_split.json
TAILN=1 item a_w2b python benchmarks/quantized.py --methods w4a16 --batches 16 32 --skip-w2 --json /tmp/res/a_w2b.json
echo "=== end $(date +%T)"
