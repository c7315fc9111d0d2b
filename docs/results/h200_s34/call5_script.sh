export OCTAVO_CACHE_DIR=$PWD/.snap/cache
timeout 150 python benchmarks/int8_gemv.py --bits 4 --m 1 --json $OUT/u4.json 2>&1 | grep -v Warning | tail -20
