set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-420}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=4 item w1 sh -c "python benchmarks/throughput.py --workload W1 --json-out $OUT/w1.json | grep -v -E \"step (profile|breakdown)\""
TAILN=4 item w2 sh -c "python benchmarks/throughput.py --workload W2 --json-out $OUT/w2.json | grep -v -E \"step (profile|breakdown)\""
TAILN=14 item q python benchmarks/quantized.py --methods bf16,fp8,w4a16,w8a16 --batches 1 16 --skip-w2 --json $OUT/q.json
echo "=== end $(date +%T)"
