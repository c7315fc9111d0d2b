# Session 46 call 2: the new defaults (CUDA NF4 GEMV, FP8 gate/up GLU epilogue) under their GPU
# tests, issue 12's figures for every method, W1 / W2 / W4, and a W8A16-vs-fp8 batch-1 profile.
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
git log --oneline -1 2>/dev/null
TAILN=6 item gpu_tests python -m pytest -m gpu -q -rf tests/kernels/test_bnb4_cuda.py tests/quantization/test_bitsandbytes.py tests/quantization/test_fp8.py tests/kernels/test_outer_scale.py
TAILN=14 item q_all python benchmarks/quantized.py --methods bf16,fp8,fp8_block,w4a16,w8a16,nf4 --batches 1 16 --skip-w2 --json /tmp/res/q_all.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
TAILN=5 item w2 python benchmarks/throughput.py --workload W2
TAILN=30 item prof_w8 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w8a16 --batch 1 --context 128 --json /tmp/res/prof_w8.json
TAILN=30 item prof_fp8 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization fp8 --batch 1 --context 128 --json /tmp/res/prof_fp8.json
echo "=== end $(date +%T)"
