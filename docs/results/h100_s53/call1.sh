# Session 53's first device call: session 52's prepared call (docs/results/h200_s52/next_session_script.sh)
# with the engine runs of the wide kernel on the sweep's best plan (OCTAVO_SWAPAB_WIDE_PLAN).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=8 item att python benchmarks/streamk_attention.py --json /tmp/res/att.json
ATT_OK=$(python - <<'PY'
import json
try:
    rows = json.load(open("/tmp/res/att.json"))["rows"]
    ok = all("us" in r and r["max_diff_vs_triton"] < 0.06 for row in rows for r in row["cuda"])
    print(1 if ok and rows else 0)
except Exception:
    print(0)
PY
)
echo "attention ok: $ATT_OK"
if [ "$ATT_OK" != "1" ]; then
TAILN=30 item t_att python -m pytest -m gpu -q -x -rf tests/kernels/test_streamk_cuda.py
fi
TAILN=4 item t_wide python -m pytest -m gpu -q -rf -x tests/kernels/test_swapab_wide.py
WIDE_OK=$(grep -c " passed" /tmp/res/t_wide.log); grep -q "failed\|error" /tmp/res/t_wide.log && WIDE_OK=0
echo "wide ok: $WIDE_OK"
if [ "$WIDE_OK" != "0" ]; then
TAILN=12 item g_wide python benchmarks/quantized_gemm.py --bits 4 --paths layout swapab swapab_dequant wide --m 32 64 128 256 --json /tmp/res/g_wide.json
TAILN=14 item wide_sweep python benchmarks/quantized_gemm.py --wide-sweep --m 64 128 256 --json /tmp/res/wide_sweep.json
export OCTAVO_SWAPAB_WIDE_PLAN=$(python - <<'PY'
import json, collections
try:
    rows = json.load(open("/tmp/res/wide_sweep.json"))["rows"]
except Exception:
    rows = []
tot = collections.Counter(); n = collections.Counter()
for r in rows:
    if r["M"] < 128: continue
    for a in r["all"]:
        c = a["cfg"]
        if "us" in a and c["nt"] == 8:
            key = f'{c["warps"]},{int(c["wsmem"])},{c["ctas_per_sm"]}'
            tot[key] += a["us"]; n[key] += 1
full = max(n.values()) if n else 0
best = min((k for k in tot if n[k] == full), key=lambda k: tot[k], default="4,0,2")
print(best)
PY
)
echo "plan: $OCTAVO_SWAPAB_WIDE_PLAN"
fi
TAILN=8 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 64 128 256 --json /tmp/res/q_base.json
if [ "$WIDE_OK" != "0" ]; then
OCTAVO_SWAPAB_WIDE_MIN_M=129 TAILN=6 item q_wide129 python benchmarks/quantized.py --methods w4a16 --batches 128 256 --json /tmp/res/q_wide129.json
fi
unset OCTAVO_SWAPAB_WIDE_PLAN
if [ "$ATT_OK" = "1" ]; then
OCTAVO_ATTN_CUDA=1 TAILN=3 item w1_cuda python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1_cuda.json
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
fi
if [ "$WIDE_OK" != "0" ]; then
OCTAVO_SWAPAB_WIDE_MIN_M=17 TAILN=6 item q_wide17 python benchmarks/quantized.py --methods w4a16 --batches 64 128 256 --skip-w2 --json /tmp/res/q_wide17.json
fi
TAILN=12 item q_small python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_small.json
echo "=== end $(date +%T)"
