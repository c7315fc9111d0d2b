# Session 62, call 2 (the same warm machine, tree 15950a6): call 1's GPU tests ran out of
# their 150 s (Triton's first compiles); again with more time. Output: 139 passed, 62
# deselected in 179.23 s (no files).
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.; mkdir -p $OUT; timeout 280 python -m pytest -m gpu -q -rf -x tests/quantization/test_w4a16_swapab.py tests/quantization/test_int_weight_layout.py 2>&1 | tail -15
