set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-300}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=22 item prof_w4a16_b16 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 16 --context 128 --json $OUT/prof_w4a16_b16.json
TAILN=22 item prof_fp8_b16 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization fp8 --batch 16 --context 128 --json $OUT/prof_fp8_b16.json
echo "=== end $(date +%T)"
