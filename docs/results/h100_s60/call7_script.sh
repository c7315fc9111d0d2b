# Session 60's seventh call (same warm machine as call 6): Qwen3-0.6B bf16 W4 batches 8 / 16
export BUDGET=100; . scripts/device_items.sh; TAILN=3 item qd python benchmarks/latency.py --batch-sizes 8,16 --json-out /tmp/res/qd.json; OCTAVO_ATTN_STREAMK_TILE=64,4,3 TAILN=3 item q64 python benchmarks/latency.py --batch-sizes 8,16 --json-out /tmp/res/q64.json
