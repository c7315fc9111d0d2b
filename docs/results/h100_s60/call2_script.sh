# Session 60's second call: the new defaults (bf16x2 / half2 dequantization in the large-batch
# kernel, float16 models on it) against bf16, then the gated store's rows: W4A16 batch
# 1 / 4 / 8 / 16 with it off, on, on to 8 rows, off again.
export BUDGET=${BUDGET:-420}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item t_gpu timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_glu.py tests/kernels/test_swapab_wgmma.py -k "routing or fp16 or glu or gated or blocked or cap"
TAILN=8 item q python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 128 256 --json /tmp/res/q.json
TAILN=2 item g_off python benchmarks/quantized.py --methods w4a16 --batches 1 4 8 16 --skip-w2 --json /tmp/res/g_off.json
OCTAVO_SWAPAB_GLU=1 TAILN=2 item g_on python benchmarks/quantized.py --methods w4a16 --batches 1 4 8 16 --skip-w2 --json /tmp/res/g_on.json
OCTAVO_SWAPAB_GLU=1 OCTAVO_SWAPAB_GLU_MAX_M=8 TAILN=2 item g_cap8 python benchmarks/quantized.py --methods w4a16 --batches 1 4 8 16 --skip-w2 --json /tmp/res/g_cap8.json
TAILN=2 item g_off2 python benchmarks/quantized.py --methods w4a16 --batches 1 4 8 16 --skip-w2 --json /tmp/res/g_off2.json
OCTAVO_SWAPAB_GLU=1 TAILN=2 item g_on2 python benchmarks/quantized.py --methods w4a16 --batches 1 4 8 16 --skip-w2 --json /tmp/res/g_on2.json
TAILN=4 item q_f16 python benchmarks/quantized.py --dtype float16 --methods w4a16 --batches 128 256 --json /tmp/res/q_f16.json
echo "=== end $(date +%T)"
