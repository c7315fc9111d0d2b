set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-140}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 20 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/callF.tgz -C /tmp res; }
nvidia-smi --query-gpu=name --format=csv,noheader
TAILN=4 item block_tests python -m pytest -m gpu -q -rf tests/kernels/test_fp8_block_gemm.py
TAILN=8 item q_block env OCTAVO_FP8_BLOCK_KEPT=1 python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 16 --output-len 64 --skip-w2 --json /tmp/res/q_block.json
echo "=== end $(date +%T)"
