# The next session's first device call (copy to .snap/, carry [".snap"]; session 48 had no
# device time). Before it, here: `git archive 6d1ab6a octavo | tar -x -C .snap/old` (the
# row-by-row logits processing, for the W1 --penalties pair below). It measures session 48's fused bitsandbytes 4-bit GEMM (octavo/kernels/
# bnb4_gemm.py, off by default: OCTAVO_BNB4_GEMM_MAX_M) against what NF4 batches past the
# CUDA GEMV run today (dequantize the whole weight, then cuBLAS), kernel and engine, then
# re-reads issue 12 / 15's figures. Flip the default (envs.bnb4_gemm_max_m) to the rows where
# the GEMM wins, and OCTAVO_BNB4_CUDA_MAX_M down if it also beats the CUDA GEMV at 3-8 rows.
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item gpu_tests python -m pytest -m gpu -q -x -rf tests/kernels/test_bnb4_gemm.py tests/kernels/test_bnb4_cuda.py tests/quantization/test_bitsandbytes.py
for m in 4 16 64 256; do
  TAILN=8 item k_m$m python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --m $m --kernels nf4_gemm nf4_dequant_triton bf16_cublas
done
OCTAVO_PDL=0 TAILN=30 item prof_w4 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 1 --context 128 --json /tmp/res/prof_w4.json
OCTAVO_PDL=0 TAILN=30 item prof_q32 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 32 --context 256 --json /tmp/res/prof_q32.json
TAILN=12 item e_dequant python benchmarks/quantized.py --methods bf16,nf4 --batches 4 8 16 64 256 --skip-w2 --json /tmp/res/e_dequant.json
OCTAVO_BNB4_GEMM_MAX_M=256 TAILN=12 item e_gemm python benchmarks/quantized.py --methods nf4 --batches 4 8 16 64 256 --skip-w2 --json /tmp/res/e_gemm.json
# The step's logits processing batched (a7a4967), with penalty requests kept on asynchronous
# scheduling (f4b07bf), against row by row and synchronous (6d1ab6a): W1 with every request
# asking for frequency / presence / repetition penalties, and W1 plain for reference.
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
PYTHONPATH=.snap/old:. TAILN=5 item w1_pen_old python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen_old.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
echo "=== end $(date +%T)"
# A second call (the figures, as session 47's script): quantized.py --methods
# bf16,fp8,fp8_block,w4a16,w8a16 --batches 1 16 --skip-w2; throughput.py --workload W1 / W2;
# latency.py --batch-sizes 1,32 --repeat 3.
