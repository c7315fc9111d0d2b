set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
P=benchmarks/quantized.py
TAILN=4 item gputests python -m pytest -q -x -p no:cacheprovider -m gpu tests/kernels/test_int8_gemv.py tests/quantization/test_int_weight_layout.py tests/quantization/test_compressed_tensors.py tests/kernels/test_fp8_qkv_rope.py tests/kernels/test_l2_prefetch.py
TAILN=12 item q_b1 python $P --methods bf16,fp8,w4a16,w8a16,w8a16_channel --batches 1 --skip-w2 --json $OUT/c1.json
TAILN=8 item q_ch_alongk env OCTAVO_INT_WEIGHT_LAYOUT=along_k python $P --methods w8a16_channel --batches 1 16 --skip-w2 --json $OUT/c2.json
TAILN=8 item q_ch_rows16 python $P --methods w8a16_channel --batches 16 --skip-w2 --json $OUT/c3.json
TAILN=30 item micro python benchmarks/int8_gemv.py --m 1 --json $OUT/micro.json
item lat python benchmarks/latency.py --batch-sizes 1,32 --repeat 3 --json-out $OUT/lat.json
echo "=== end $(date +%T)"
