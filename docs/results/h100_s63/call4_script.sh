# Session 63 call 4: 117b252 as committed (8-bit layers in the swap-AB layout by default, no
# switch): W8A16 against bf16 at batch 1 / 16, then W8A16's W2.
export BUDGET=${BUDGET:-190}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
rm -f /tmp/res/*
TAILN=3 item c_b python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/c_b.json
TAILN=2 item c_w2 python benchmarks/quantized.py --methods w8a16 --batches 1 --json /tmp/res/c_w2.json
echo "=== end $(date +%T)"
