# One device call that decides what session 35 left ready (copy to .snap/, carry [".snap"]).
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-540}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=6 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_dense_mma.py tests/quantization/test_w4a16_gemm.py -k "glu or ahead"
TAILN=6 item w4_glu0 python benchmarks/latency.py --batch-sizes 1,8,32 --repeat 3 --json-out $OUT/w4_glu0.json
TAILN=6 item w4_glu1 env OCTAVO_DENSE_GLU=1 python benchmarks/latency.py --batch-sizes 1,8,32 --repeat 3 --json-out $OUT/w4_glu1.json
TAILN=10 item q_sz0 python benchmarks/quantized.py --methods bf16,w4a16,w8a16 --batches 16 64 --skip-w2 --json $OUT/q_sz0.json
TAILN=6 item q_sz1 env OCTAVO_INT_GEMM_SZ_AHEAD=1 python benchmarks/quantized.py --methods w4a16,w8a16 --batches 16 64 --skip-w2 --json $OUT/q_sz1.json
TAILN=60 item cublas python benchmarks/cublas_rows.py --shape llama-3.1-8b --json $OUT/cublas_rows.json
# Then W2 with the rule the sweep names, e.g. (the 128-row gate_up of session 35):
TAILN=6 item w2_pad0 sh -c "python benchmarks/throughput.py --workload W2 | grep tok/s"
TAILN=6 item w2_pad1 sh -c "OCTAVO_CUBLAS_PAD_ROWS=113-128:192/28672 python benchmarks/throughput.py --workload W2 | grep tok/s"
echo "=== end $(date +%T)"
