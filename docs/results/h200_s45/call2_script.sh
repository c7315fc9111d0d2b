. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_fp8_rows_gemm.py
TAILN=20 item rows_probe python benchmarks/fp8_rows_gemm.py --json /tmp/res/rows_probe.json
TAILN=6 item q_rows0 python benchmarks/quantized.py --methods bf16,fp8 --batches 8 16 32 64 --skip-w2 --json /tmp/res/q_rows0.json
OCTAVO_FP8_ROWS_GEMM_MAX_M=64 TAILN=6 item q_rows64 python benchmarks/quantized.py --methods fp8 --batches 16 32 64 --skip-w2 --json /tmp/res/q_rows64.json
echo "=== end $(date +%T)"
