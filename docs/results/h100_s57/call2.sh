# Session 57, call 2: the new defaults (CUDA large-batch kernel on, launch sum, bf16 math, deep)
# checked on the GPU, the kernel at 64-128 rows against the swap-AB GEMM, the engine at
# batch 1-256 + W2, and with the kernel from the crossover row count.
export BUDGET=${BUDGET:-400}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=12 item t_gpu timeout 150 python -m pytest -m gpu -q -rf -k "not cluster" tests/kernels/test_swapab_wgmma.py tests/kernels/test_split_sum.py tests/quantization/test_swapab_large.py
TAILN=6 item g_small timeout 120 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 64 80 96 112 128 --forms cuda_bf16_deep --split-sums --json /tmp/res/g_small.json
MIN=$(python - <<'PY' 2>/dev/null || echo 129
import json
rows = json.loads(open("/tmp/res/g_small.json").read())["rows"]
ms = sorted({r["M"] for r in rows})
win = {m: sum(r["cuda_bf16_deep_us"] for r in rows if r["M"] == m)
          < sum(r["engine_us"] for r in rows if r["M"] == m) for m in ms}
best = 129
for m in reversed(ms):
    if not win[m]:
        break
    best = m
print(best)
PY
)
echo "crossover: $MIN"
TAILN=8 item q_new python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 64 128 256 --json /tmp/res/q_new.json
if [ "$MIN" != 129 ]; then
OCTAVO_INT_LARGE_MIN_M=$MIN TAILN=6 item q_min python benchmarks/quantized.py --methods w4a16 --batches 64 128 256 --json /tmp/res/q_min.json
fi
echo "=== end $(date +%T)"
