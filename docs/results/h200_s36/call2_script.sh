set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-500}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | tail -${TAILN:-6}; }
TAILN=4 item gputests python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_dense_mma.py tests/quantization/test_w4a16_gemm.py
TAILN=30 item qgemm python benchmarks/quantized_gemm.py --paths default gemm --bits 4 8 --m 128 192 256 --json $OUT/qgemm.json
TAILN=40 item prof_prefill env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-0.6b --prefill 16384 --json $OUT/prof_prefill.json
TAILN=40 item prof_b48 env OCTAVO_PDL=0 python benchmarks/profile_step.py --shape qwen3-0.6b --batch 48 --context 1500 --json $OUT/prof_b48.json
TAILN=4 item w1 sh -c "python benchmarks/throughput.py --workload W1 --json-out $OUT/w1.json | grep tok/s"
echo "=== end $(date +%T)"
