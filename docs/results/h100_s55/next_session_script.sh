# The next session's first device call (copy to .snap/, carry [".snap"]; about 7 minutes with
# its start). Session 55 made the CUDA large-batch 4-bit GEMM (swapab_wgmma) 2.3x faster and
# routed it to the layers it wins on (worth: Llama-8B gate_up / down), then ran out of device
# time before the engine ran it so routed, and before two new forms ran on a GPU: a bf16x2
# dequantization (OCTAVO_INT_LARGE_BF16_MATH) and two MMA groups in flight
# (OCTAVO_INT_LARGE_DEEP). The per-layer run also times 96 and 128 rows against the engine's
# swap-AB GEMMs there ("engine"): one 128-row tile of gate_up may beat them (about 72 us
# expected against 105 at 128 rows, session 51). In order: the GPU tests of all four forms, the layers with each
# form, the serial baseline, the engine with the float form, then with the fastest correct
# form on gate_up + down at 256 rows (scripts/pick_wgmma_form.py) where that is another.
# The baseline (q_base) is the default since f03da5f (session 55): the Triton swapab_large on
# gate_up at 129-256 rows (OCTAVO_INT_LARGE_MAX_M=256 by default), the rest dequantize-then-
# cuBLAS.
export BUDGET=470
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=10 item t_wgmma timeout 120 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py
# Every form where every test passed, else only the float form (it passed in session 55; a
# fault in a form spoils the process for the rest).
FORMS="cuda cuda_bf16 cuda_deep cuda_bf16_deep"
grep -q " passed" /tmp/res/t_wgmma.log && ! grep -q "failed\|error" /tmp/res/t_wgmma.log || FORMS=cuda
echo "forms timed: $FORMS"
TAILN=16 item g_cuda timeout 150 python benchmarks/large_int_gemm.py --shapes gate_up down qkv o --m 96 128 129 192 256 --forms $FORMS --json /tmp/res/g_cuda.json
FORM=$(python scripts/pick_wgmma_form.py /tmp/res/g_cuda.json --m 256 2>/dev/null || echo "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0")
echo "fastest correct form: $FORM"
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_cuda python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_cuda.json
if [ "$FORM" != "OCTAVO_INT_LARGE_BF16_MATH=0 OCTAVO_INT_LARGE_DEEP=0" ]; then
(export $FORM; OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_best python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_best.json)
fi
echo "=== end $(date +%T)"
