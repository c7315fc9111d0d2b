# Session 60's fourth call: W4A16 decode steps profiled with the session's defaults (gated
# store to 8 rows), batch 1 and 16, and bf16 at 16 for the per-class comparison: where
# batch 16's 1.92x (target 2x) spends its time.
export BUDGET=${BUDGET:-300}
. scripts/device_items.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for b in 1 16; do
  OCTAVO_PDL=0 TAILN=16 item p_w4_b$b python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch $b --context 256 --json /tmp/res/p_w4_b$b.json
done
OCTAVO_PDL=0 TAILN=16 item p_bf16_b16 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization bf16 --batch 16 --context 256 --json /tmp/res/p_bf16_b16.json
echo "=== end $(date +%T)"
