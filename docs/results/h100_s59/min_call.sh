# Session 59's last-chance call: the unrun pieces' GPU tests (gated / rotary stores, unrolled
# K-split sum), then W4A16 batch 1 / 16 with both stores off, on, off again.
export BUDGET=${BUDGET:-250}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=8 item t_gpu timeout 130 python -m pytest -m gpu -q -rf tests/kernels/test_split_sum.py tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_rope.py
TAILN=4 item q_off python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_off.json
OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_both python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_both.json
TAILN=4 item q_off2 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_off2.json
echo "=== end $(date +%T)"
