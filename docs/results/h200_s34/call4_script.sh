set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-330}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
P=benchmarks/quantized.py
TAILN=6 item ch_rows python $P --methods w8a16_channel --batches 64 256 --skip-w2 --json $OUT/ch_rows.json
TAILN=6 item ch_alongk env OCTAVO_INT_WEIGHT_LAYOUT=along_k python $P --methods w8a16_channel --batches 64 256 --skip-w2 --json $OUT/ch_alongk.json
TAILN=6 item ch_rows_m32 env OCTAVO_INT_GEMM_FUSED_MAX_M=32 python $P --methods w8a16_channel --batches 64 --skip-w2 --json $OUT/ch_rows_m32.json
TAILN=16 item prof_w4a16 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape llama-3.1-8b --quantization w4a16 --batch 1 --context 128 --json $OUT/prof_w4a16.json
echo "=== end $(date +%T)"
