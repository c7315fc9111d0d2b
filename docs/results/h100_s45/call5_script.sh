. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=8 item q_fp8_final python benchmarks/quantized.py --methods bf16,fp8 --batches 16 64 128 256 --json /tmp/res/q_fp8_final.json
echo "=== end $(date +%T)"
