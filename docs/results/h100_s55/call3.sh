# Session 55 call 3: the engine with the CUDA kernel on gate_up / down only (worth), against
# the serial path in the same call.
export BUDGET=300
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
OCTAVO_INT_LARGE_MAX_M=256 OCTAVO_INT_LARGE_CUDA=1 TAILN=3 item q_wgmma python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_wgmma.json
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
echo "=== end $(date +%T)"
