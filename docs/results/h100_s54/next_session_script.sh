# The next session's first device call (copy to .snap/, carry [".snap"]; about 6 minutes with
# its start): swapab_large (session 54, off: OCTAVO_INT_LARGE_MAX_M) in the engine for the first
# time, after its fp16-scale fix and without K splits, against the serial path on the same
# machine; then its tiles per layer again (gate_up is the only Llama-8B layer it takes).
export BUDGET=420
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=6 item t_large python -m pytest -m gpu -q -rf -x tests/quantization/test_swapab_large.py -k "default or bits or graph or routing"
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_LARGE_MAX_M=256 TAILN=3 item q_large python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_large.json
TAILN=6 item g_large python benchmarks/large_int_gemm.py --shapes gate_up --m 129 192 256 384 --json /tmp/res/g_large.json
echo "=== end $(date +%T)"
