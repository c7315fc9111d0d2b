# Session 44, call 4: the blockwise _scaled_mm from 3 rows (the Triton GEMM only where it does not run).
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-230}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/res.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=8 item gpu_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_blocks.py
TAILN=8 item q_block python benchmarks/quantized.py --methods bf16,fp8_block --batches 4 8 16 --skip-w2 --json /tmp/res/q_block.json
echo "=== end $(date +%T)"
