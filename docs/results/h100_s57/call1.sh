# The next session's first device call (copy to .snap/, carry [".snap"]; about 8-9 minutes with
# its start). Session 56 got no device machine (every start refused), so this is session 55's
# prepared call plus session 56's A/B of who sums the CUDA large-batch 4-bit GEMM's
# (swapab_wgmma) K-split partials: each tile's last CTA (today), a second launch over every SM
# (OCTAVO_INT_LARGE_SPLIT_SUM=launch, split_sum.py), or the tile's split CTAs as a thread block
# cluster through distributed shared memory (=cluster: no partials in global memory). At 256
# rows qkv / o / down run 25-40 us past what their MMA steps predict (H100, session 55): the
# last CTA's lone sum of 256-512 KB, or the partials' traffic. If a sum removes it, qkv (~67 ->
# ~35 us) and o (~57 -> ~17-25) beat dequantize-then-cuBLAS (50 / 33), down drops to ~61, and
# worth's split line (OCTAVO_INT_LARGE_MIN_SPLIT_STEPS, 48) can go.
# In order: the GPU tests but the cluster's; the layers at 128 / 256 rows with every form,
# unsplit ("split1") and with the launch sum ("launch"; "sum_only" is that launch alone); the
# baseline (bf16, and W4A16 at the default: Triton on gate_up at 129-256 rows); the engine with
# the float form routed by worth; the cluster's tests and layers in processes of their own (a
# fault in a cluster launch spoils its process); the engine with the faster new sum and every
# split layer routed; the fastest correct form on gate_up + down (scripts/pick_wgmma_form.py)
# where that is another.
export BUDGET=${BUDGET:-500}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=10 item t_wgmma timeout 120 python -m pytest -m gpu -q -rf -k "not cluster" tests/kernels/test_swapab_wgmma.py tests/kernels/test_split_sum.py
FORMS="cuda cuda_bf16 cuda_deep cuda_bf16_deep"
grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log || FORMS=cuda
echo "forms timed: $FORMS"
TAILN=10 item g_cuda timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 128 256 --forms $FORMS --splits 1 --split-sums launch --json /tmp/res/g_cuda.json
FORM=$(python scripts/pick_wgmma_form.py /tmp/res/g_cuda.json --m 256 2>/dev/null || echo "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0")
echo "fastest correct form: $FORM"
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
export OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1
TAILN=3 item q_cuda python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_cuda.json
TAILN=6 item t_cluster timeout 60 python -m pytest -m gpu -q -rf -k cluster tests/kernels/test_swapab_wgmma.py
SUM=launch
if grep -q " passed" /tmp/res/t_cluster.log && ! grep -q "failed\|error" /tmp/res/t_cluster.log; then
  TAILN=4 item g_cluster timeout 60 python benchmarks/large_int_gemm.py --shapes down qkv o --m 256 --forms cuda --split-sums cluster --json /tmp/res/g_cluster.json
  # The cluster where it beats the launch sum over the split layers at 256 rows.
  SUM=$(python - <<'PY' 2>/dev/null || echo launch
import json
def rows(f):
    return {r["shape"]: r for r in json.loads(open(f).read())["rows"] if r["M"] == 256}
a, b = rows("/tmp/res/g_cuda.json"), rows("/tmp/res/g_cluster.json")
launch = sum(a[s]["cuda_launch_us"] for s in b)
cluster = sum(b[s]["cuda_cluster_us"] for s in b)
print("cluster" if cluster < launch else "launch")
PY
)
fi
echo "split sum: $SUM"
OCTAVO_INT_LARGE_SPLIT_SUM=$SUM OCTAVO_INT_LARGE_MIN_SPLIT_STEPS=1 TAILN=3 item q_sum python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_sum.json
if [ "$FORM" != "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0" ]; then
(export $FORM; TAILN=3 item q_best python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_best.json)
fi
echo "=== end $(date +%T)"
