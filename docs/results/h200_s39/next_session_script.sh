# The next session's first device call (copy to .snap/, carry [".snap"]): where a
# mixture-of-experts decode step goes now that the grouped Triton kernel is the default
# (session 39: Qwen3-30B-A3B shape, batch 1 at 6.6 ms a token, about a fifth of HBM), then
# the W2 / W4 batch-32 figures that issue 15 still asks for.
# Each item runs python directly under `timeout -k` (see docs/results/h200_s36/).
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-540}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout -k 5 $left "$@" > /tmp/item.log 2>&1; grep -v "^RESULT_JSON" /tmp/item.log | grep -v Warning | tail -${TAILN:-6}; }
# per-kernel table of one MoE decode step (PDL off so the per-kernel times do not overlap)
TAILN=40 item prof_moe_b1 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-30b-a3b --batch 1 --context 128 --steps 8 --json $OUT/prof_moe_b1.json
TAILN=40 item prof_moe_b64 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-30b-a3b --batch 64 --context 256 --steps 8 --json $OUT/prof_moe_b64.json
TAILN=40 item prof_w4_b32 env OCTAVO_PDL=0 python benchmarks/profile_step.py --batch 32 --context 256 --json $OUT/prof_b32.json
TAILN=4 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
echo "=== end $(date +%T)"
