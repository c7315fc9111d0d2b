# Session 46 call 3 (the budget's last ~250 s): the CUDA NF4 GEMV for 3-16 rows (a launch
# per 4): its GPU tests, then the engine at batches 4 and 16 against bf16.
export BUDGET=170
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf -x tests/kernels/test_bnb4_cuda.py
TAILN=8 item q_nf4 python benchmarks/quantized.py --methods bf16,nf4 --batches 4 16 --skip-w2 --json /tmp/res/q_nf4_rows.json
echo "=== end $(date +%T)"
