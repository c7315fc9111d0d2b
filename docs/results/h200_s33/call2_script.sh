set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-570}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
Q="--batches 1 --skip-w2"
P=benchmarks/quantized.py
TAILN=12 item gputests python -m pytest -q -x -p no:cacheprovider -m gpu tests/kernels/test_int8_gemv.py tests/quantization/test_int_weight_layout.py
TAILN=8 item ctfix python -m pytest -q -x -p no:cacheprovider tests/quantization/test_compressed_tensors.py -k "fixture_matches"
item q_bf16_w8 python $P --methods bf16,w8a16 $Q --json $OUT/b1.json
item q_w8_alongk env OCTAVO_INT_WEIGHT_LAYOUT=along_k python $P --methods w8a16 $Q
item q_w8_none env OCTAVO_L2_PREFETCH=none python $P --methods w8a16 $Q
TAILN=200 item micro python benchmarks/int8_gemv.py --m 1 --sweep --json $OUT/micro1.json
item lat_def python benchmarks/latency.py --batch-sizes 1 --repeat 3 --json-out $OUT/l1.json
item lat_none env OCTAVO_L2_PREFETCH=none python benchmarks/latency.py --batch-sizes 1 --repeat 3 --json-out $OUT/l2.json
item lat_def2 python benchmarks/latency.py --batch-sizes 1 --repeat 3
echo "=== end $(date +%T)"
