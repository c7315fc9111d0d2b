# Session 58's last-chance call: the gated and rotary decode stores' GPU tests, then W4A16 batch 1 / 16
# with it off and on (no bf16: the ratio against session 57's bf16 figures only).
export BUDGET=${BUDGET:-200}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=8 item t_glu timeout 120 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_rope.py
TAILN=4 item q_off python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_off.json
OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_ROPE=1 TAILN=4 item q_both python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_both.json
TAILN=4 item q_off2 python benchmarks/quantized.py --methods w4a16 --batches 1 16 --skip-w2 --json /tmp/res/q_off2.json
echo "=== end $(date +%T)"
