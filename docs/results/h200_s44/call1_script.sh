# Session 44, call 1: session 43's untested GPU paths, block-FP8 GEMV plans against the row GEMV.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s); BUDGET=${BUDGET:-575}
mkdir -p /tmp/res
item() { local left=$((BUDGET - ($(date +%s) - START))); if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi; echo "=== $1 $(date +%T)"; local name=$1; shift; timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1; echo "rc=$?"; grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}; tar czf $OUT/res.tgz -C /tmp res; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
git log -1 --format=%h 2>/dev/null
TAILN=8 item gpu_tests python -m pytest -m gpu -q -rf tests/quantization/test_fp8_blocks.py tests/quantization/test_fp8_moe.py tests/kernels/test_fp8_block_gemm.py tests/kernels/test_fp8_block_gemv.py tests/quantization/test_fp8.py
P="fp8_gemv fp8_block_gemv fp8_block_fold fp8_block_gemv_32_128_4_2_2 fp8_block_gemv_64_128_4_2_2 fp8_block_gemv_128_128_8_2_2 fp8_block_gemv_64_128_8_1_3 fp8_block_gemv_16_128_4_4_3 fp8_block_gemv_64_128_4_4_3"
G="fp8_gemv_glu fp8_block_gemv_glu fp8_block_fold_glu"
TAILN=14 item gemv_k4096 python benchmarks/gemv_scaling.py --k 4096 --n 4096 6144 28672 --kernels $P --json /tmp/res/gemv_k4096.json
TAILN=6 item gemv_glu python benchmarks/gemv_scaling.py --k 4096 --n 14336 28672 57344 --kernels $G --json /tmp/res/gemv_glu.json
TAILN=14 item gemv_k14336 python benchmarks/gemv_scaling.py --k 14336 --n 2048 4096 --kernels $P --json /tmp/res/gemv_k14336.json
TAILN=6 item q_fold env OCTAVO_FP8_BLOCK_FOLD=1 python benchmarks/quantized.py --methods fp8_block --batches 1 2 --skip-w2 --json /tmp/res/q_fold.json
TAILN=16 item q_block python benchmarks/quantized.py --methods bf16,fp8_block,fp8 --batches 1 2 16 64 256 --skip-w2 --json /tmp/res/q_block.json
TAILN=6 item q_block_off env OCTAVO_FP8_BLOCK_GEMM_MAX_M=0 python benchmarks/quantized.py --methods fp8_block --batches 64 256 --skip-w2 --json /tmp/res/q_block_off.json
TAILN=14 item q_moe python benchmarks/quantized.py --shape qwen3-30b-a3b --methods bf16,w4a16,fp8_block --batches 1 16 64 --skip-w2 --json /tmp/res/q_moe.json
TAILN=8 item q_w2 python benchmarks/quantized.py --methods bf16,fp8_block --batches 1 --json /tmp/res/q_w2.json
echo "=== end $(date +%T)"
