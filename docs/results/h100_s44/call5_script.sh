# Session 44, call 5 (short): the bitsandbytes 4-bit GEMV's GPU tests and its first timing.
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 70 python -m pytest -m gpu -q -rf -x tests/kernels/test_bnb4_gemv.py tests/quantization/test_bitsandbytes.py 2>&1 | tail -5
timeout 50 python benchmarks/gemv_scaling.py --k 4096 --n 4096 28672 --kernels bf16_cublas nf4_gemv nf4_dequant 2>&1 | grep -v RESULT_JSON | tail -12
