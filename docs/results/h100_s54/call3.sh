# Session 54's third call: swapab_large in the register-operand form (wgmma A from registers), gate_up and down.
# its tests, a tile sweep against dequantize-then-cuBLAS and bf16, then the engine at batch 256
# and W2 with it on the sweep's best tile against the serial path.
export BUDGET=420
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item t_large python -m pytest -m gpu -q -rf -x tests/quantization/test_swapab_large.py -k "default or bits or graph or routing"
TAILN=12 item sweep python benchmarks/large_int_gemm.py --sweep --shapes gate_up down --m 256 --json /tmp/res/sweep.json
export OCTAVO_INT_LARGE_PLAN=$(python - <<'PY'
import json, collections
try:
    rows = json.load(open("/tmp/res/sweep.json"))["rows"]
except Exception:
    rows = []
keys = ("block_m", "cols", "num_warps", "block_k", "num_stages")
tot = collections.Counter(); n = collections.Counter()
for r in rows:
    if r["M"] != 256: continue
    for e in r["large"]:
        c = e["cfg"]
        if c == {}: c = dict(zip(keys, (256, 2, 8, 64, 3)))
        if set(c) != set(keys) or "us" not in e or e["rel_err"] > 5e-3: continue
        k = ",".join(str(c[x]) for x in keys)
        tot[k] += e["us"]; n[k] += 1
full = max(n.values()) if n else 0
print(min((k for k in tot if n[k] == full), key=lambda k: tot[k], default="256,2,8,64,3"))
PY
)
echo "plan: $OCTAVO_INT_LARGE_PLAN"
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_LARGE_MAX_M=256 TAILN=3 item q_large python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_large.json
echo "=== end $(date +%T)"
