# Session 65 call 2: short split parts merged in the launch at batch 1 (OCTAVO_ATTN_SPLIT_MERGE=1
# OCTAVO_ATTN_MERGE_PART_KEYS=64/128) against the default (short parts + a second merging launch).
export BUDGET=${BUDGET:-560}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
TAILN=3 item t_attn timeout 150 python -m pytest -m gpu -q -rf tests/kernels/test_paged_attention.py -k "merge or short_parts or split"
K64="env OCTAVO_ATTN_SPLIT_MERGE=1 OCTAVO_ATTN_MERGE_PART_KEYS=64"
K128="env OCTAVO_ATTN_SPLIT_MERGE=1 OCTAVO_ATTN_MERGE_PART_KEYS=128"
TAILN=2 item l_def1 python benchmarks/latency.py --batch-sizes 1 --repeat 3
TAILN=2 item l_k64a $K64 python benchmarks/latency.py --batch-sizes 1 --repeat 3
TAILN=2 item l_k128 $K128 python benchmarks/latency.py --batch-sizes 1 --repeat 3
TAILN=2 item l_def2 python benchmarks/latency.py --batch-sizes 1 --repeat 3
TAILN=2 item l_k64b $K64 python benchmarks/latency.py --batch-sizes 1 --repeat 3
TAILN=5 item q_def python benchmarks/quantized.py --methods bf16,w8a16,w4a16 --batches 1 --skip-w2 --json /tmp/res/q_def.json
TAILN=5 item q_k64 $K64 python benchmarks/quantized.py --methods bf16,w8a16,w4a16 --batches 1 --skip-w2 --json /tmp/res/q_k64.json
echo "=== end $(date +%T)"
