# Session 64 call 2, tree 0f2ab86: the 8-bit large-batch kernel on by default. Its routing test
# and the 4-bit forms' GPU tests (their SASS is unchanged; the wrapper's signature is not);
# W8A16 against bf16 as committed (issue 12's table row); W3's server against offline at HEAD
# (fastapi 0.165 needs opentelemetry-api: carried now).
export BUDGET=${BUDGET:-470}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
TAILN=4 item t_wg timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py -k "routing or launch_sum or fp16_activations_gpu"
TAILN=4 item q8 python benchmarks/quantized.py --methods bf16,w8a16 --batches 1 16 64 128 256 --json /tmp/res/q8.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
PYTHONPATH=/tmp/site:. TAILN=16 item w3 python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3.json
echo "=== end $(date +%T)"
