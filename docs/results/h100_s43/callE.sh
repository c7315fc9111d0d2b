set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-200}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/callE.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=4 item fp8_engine_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_moe.py
TAILN=8 item q_fp8_block python benchmarks/quantized.py --shape qwen3-30b-a3b --methods fp8_block,fp8 --batches 1 16 --skip-w2 --json /tmp/res/q_fp8_block.json
echo "=== end $(date +%T)"
