# The next session's first device call (copy to .snap/, carry [".snap"]). Session 46 got two
# H100 calls; its last change never reached a GPU: the CUDA NF4 GEMV for 3-16 rows (a launch
# per 4 rows, OCTAVO_BNB4_CUDA_MAX_M, default 2 until measured here; Llama-8B NF4 at batch 16
# took 19.127 ms per token on the dequantize-then-cuBLAS path, 0.35x bf16, on an H100). Then
# issue 12 / 15's figures on an H200 if one starts (sessions 45-46 got H100s for most calls).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_bnb4_cuda.py tests/quantization/test_bitsandbytes.py
TAILN=8 item q_nf4_rows env OCTAVO_BNB4_CUDA_MAX_M=16 python benchmarks/quantized.py --methods bf16,nf4 --batches 2 4 8 16 --skip-w2 --json /tmp/res/q_nf4_rows.json
TAILN=5 item q_nf4_dequant python benchmarks/quantized.py --methods nf4 --batches 4 8 16 --skip-w2 --json /tmp/res/q_nf4_dequant.json
TAILN=14 item q_all python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_all.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1
TAILN=5 item w2 python benchmarks/throughput.py --workload W2
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
