# Session 53's second call: on an H200 only (the targets' device; an H100 exits at once):
# the CUDA stream-K attention kernel against Triton (H100: 5-25% slower), W1 A/B, issue 12's
# batch-1 / 16 figures, W2.
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
TAILN=8 item att python benchmarks/streamk_attention.py --cases w1_b256 w1_b128 w1_b64 w4_b32 w2_b256 --ctas 2 3 --json /tmp/res/att.json
OCTAVO_ATTN_CUDA=1 TAILN=3 item w1_cuda python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1_cuda.json
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=12 item q_small python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json /tmp/res/q_small.json
TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
echo "=== end $(date +%T)"
