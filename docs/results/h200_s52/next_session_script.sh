# The next session's first device call (copy to .snap/, carry [".snap"]), about 6-7 minutes
# (item times from session 52's H200 logs: W1 26-40 s, W2 35 s, quantized.py with W2 54-93 s).
# 1. Issue 12's batch-1 / batch-16 figures on the H200 (the device): session 51's
#    W4A16 routing (qkv / o swap-AB, the CUDA kernel to 16 rows) was measured on H100s only
#    (b1 2.10x, b16 1.91x); W8A16 last measured in session 49.
# 2. W1 and W4 at main's head (session 52: W1 24,888-25,705 tok/s, 61.7-63.7% of the bound;
#    W4 batch 1 0.812 ms, batch 32 1.517).
. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=12 item q_small python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 64 --skip-w2 --json /tmp/res/q_small.json
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=5 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3
OCTAVO_PDL=0 TAILN=16 item prof_l1 python benchmarks/profile_step.py --shape llama-3.1-8b --batch 1 --context 128 --quantization w4a16 --json /tmp/res/prof_l1.json
echo "=== end $(date +%T)"
