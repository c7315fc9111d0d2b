set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-260}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=16 item probe_x python .snap/probe_x.py
TAILN=6 item w4 python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/w4.json
TAILN=6 item i8_default python benchmarks/int8_gemv.py --m 1 --json $OUT/i8_default.json
TAILN=6 item i8_scales python benchmarks/int8_gemv.py --m 1 --scale-copies --json $OUT/i8_scales.json
echo "=== end $(date +%T)"
