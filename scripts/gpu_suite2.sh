#!/usr/bin/env bash
# Shorter device call: e2e triton-vs-torch tests, W1 and W4.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/octavo-out}
mkdir -p "$OUT"
timeout 90 python3 -m pytest -q -x tests/test_triton_e2e.py 2>&1 | tail -5 | tee "$OUT/tests.log"
timeout 120 python3 benchmarks/throughput.py --workload W1 --json-out "$OUT/w1.json" 2>&1 | grep -v -i warn | tail -8 | tee "$OUT/w1.log"
timeout 90 python3 benchmarks/latency.py --json-out "$OUT/w4.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/w4.log"
