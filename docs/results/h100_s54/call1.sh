case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*) export BUDGET=540;; *) export BUDGET=400;; esac
# The next session's first device call (copy to .snap/, carry [".snap"], BUDGET=300, 480 on an H200):
# the overlapped dequantize-then-cuBLAS (session 53, OCTAVO_INT_DEQUANT_CHUNK_COLS, off) per layer
# and at W4A16 batch 256 against the serial path; add W2 (quantized.py without --skip-w2) if it wins.
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TAILN=3 item t_ov python -m pytest -m gpu -q -rf -x tests/kernels/test_dequant_overlap.py
TAILN=10 item ov python benchmarks/chunked_dequant.py --m 128 256 --chunks 2048 4096 8192 --buffers 2 --no-serial --shapes gate_up down qkv o --layouts swapab --json /tmp/res/ov.json
TAILN=4 item q_base python benchmarks/quantized.py --methods bf16,w4a16 --batches 256 --json /tmp/res/q_base.json
OCTAVO_INT_DEQUANT_CHUNK_COLS=4096 TAILN=3 item q_ov4096 python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_ov4096.json
OCTAVO_INT_DEQUANT_CHUNK_COLS=8192 TAILN=3 item q_ov8192 python benchmarks/quantized.py --methods w4a16 --batches 256 --json /tmp/res/q_ov8192.json
# On an H200 (the targets' device; none came in session 53): issue 12's batch-1 / 16 figures at
# the current routing (measured on H100s only since session 51), W1, W2.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*)
TAILN=12 item q_small python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_small.json
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
;; esac
echo "=== end $(date +%T)"
