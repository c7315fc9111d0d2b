# The next session's first device call (copy to .snap/, carry [".snap"]). Sessions 45-47 got
# H100s for nearly every call though an H200 was asked for; issue 12 / 15's targets are for
# one H200. This call re-reads them at session 47's defaults (the CUDA NF4 GEMV up to 8 rows,
# 8 weight rows a warp in flight at 2-4 rows), whatever card comes: compare only within it.
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item gpu_tests python -m pytest -m gpu -q -x -rf tests/kernels/test_bnb4_cuda.py tests/quantization/test_bitsandbytes.py
TAILN=16 item q_all python benchmarks/quantized.py --methods bf16,fp8,fp8_block,w4a16,w8a16,nf4 --batches 1 4 16 --skip-w2 --json /tmp/res/q_all.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1
TAILN=5 item w2 python benchmarks/throughput.py --workload W2
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
echo "=== end $(date +%T)"
