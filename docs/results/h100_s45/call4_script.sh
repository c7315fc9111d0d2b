. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=5 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_outer_scale.py tests/kernels/test_fp8_quant.py tests/quantization/test_fp8.py tests/quantization/test_compressed_tensors.py
TAILN=22 item rows_probe python benchmarks/fp8_rows_gemm.py --m 16 64 128 192 256 --json /tmp/res/rows_probe.json
TAILN=8 item q_fp8 python benchmarks/quantized.py --methods bf16,fp8 --batches 1 16 64 128 256 --json /tmp/res/q_fp8.json
OCTAVO_FP8_TENSORWISE_MAX_M=512 TAILN=4 item q_fp8_all python benchmarks/quantized.py --methods fp8 --batches 128 256 --json /tmp/res/q_fp8_all.json
echo "=== end $(date +%T)"
