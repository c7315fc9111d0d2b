. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=5 item gpu_tests python -m pytest -m gpu -q -rf -x tests/kernels/test_outer_scale.py tests/quantization/test_fp8.py
TAILN=22 item rows_probe python benchmarks/fp8_rows_gemm.py --m 8 16 32 64 256 --json /tmp/res/rows_probe.json
TAILN=8 item q_fp8 python benchmarks/quantized.py --methods bf16,fp8 --batches 16 32 64 256 --json /tmp/res/q_fp8.json
OCTAVO_FP8_TENSORWISE=0 TAILN=4 item q_fp8_rowwise python benchmarks/quantized.py --methods fp8 --batches 16 64 --skip-w2 --json /tmp/res/q_fp8_rowwise.json
echo "=== end $(date +%T)"
