set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache
START=$(date +%s); BUDGET=${BUDGET:-560}
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 30 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; shift; timeout $left "$@" 2>&1 | grep -v "^RESULT_JSON" | grep -v Warning | grep -E "ms per|ms|Error|error|Traceback" | tail -4; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.memory --format=csv
Q="--batches 1 --skip-w2"
P=benchmarks/quantized.py
item bf16_fp8_def python $P --methods bf16,fp8 $Q --json $OUT/a1.json
item bf16_fp8_none env OCTAVO_L2_PREFETCH=none python $P --methods bf16,fp8 $Q --json $OUT/a2.json
item fp8_o env OCTAVO_L2_PREFETCH=o python $P --methods fp8 $Q
item fp8_mlp env OCTAVO_L2_PREFETCH=mlp python $P --methods fp8 $Q
item fp8_qkv env OCTAVO_L2_PREFETCH=qkv python $P --methods fp8 $Q
item fp8_mb8 env OCTAVO_L2_PREFETCH_MB=8 python $P --methods fp8 $Q
item fp8_def2 python $P --methods fp8 $Q
item fp8_none2 env OCTAVO_L2_PREFETCH=none python $P --methods fp8 $Q
item w4_w8_def python $P --methods w4a16,w8a16 $Q --json $OUT/a3.json
item w4_w8_none env OCTAVO_L2_PREFETCH=none python $P --methods w4a16,w8a16 $Q --json $OUT/a4.json
item lat_def python benchmarks/latency.py --batch-sizes 1 --json-out $OUT/l1.json
item lat_none env OCTAVO_L2_PREFETCH=none python benchmarks/latency.py --batch-sizes 1 --json-out $OUT/l2.json
item bf16_def2 python $P --methods bf16 $Q
item bf16_none2 env OCTAVO_L2_PREFETCH=none python $P --methods bf16 $Q
echo "=== end $(date +%T)"
