# Session 63 call 3: 8-bit swap-AB routing past 32 rows (CUDA chunks to 32 rows on qkv / o,
# 64-row Triton tiles with 3 stages on gate_up) on the GPU; W8A16 with every layer swap-AB
# against the default (GEMV / along-K) layout, at max_num_seqs 256, with W2 and bf16.
export BUDGET=${BUDGET:-470}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
rm -f /tmp/res/*
TAILN=3 item t8 timeout 100 python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py -k "8_bit_wide_tiles or real_shape_every_batch"
B="--batches 1 16 48 64 128 256"
OCTAVO_INT_WEIGHT_LAYOUT=swapab TAILN=2 item q_sw python benchmarks/quantized.py --methods w8a16 $B --json /tmp/res/q_sw.json
TAILN=3 item q_def python benchmarks/quantized.py --methods bf16,w8a16 $B --json /tmp/res/q_def.json
echo "=== end $(date +%T)"
