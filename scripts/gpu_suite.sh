#!/usr/bin/env bash
# One device call: GPU tests, then W1, W4, W2. Results land in $OUT (JSON + logs).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/octavo-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -x tests/test_triton_e2e.py tests/kernels/test_triton_backend.py 2>&1 | tail -15 | tee "$OUT/tests.log"
timeout 200 python3 benchmarks/throughput.py --workload W1 --json-out "$OUT/w1.json" 2>&1 | tail -20 | tee "$OUT/w1.log"
timeout 120 python3 benchmarks/latency.py --json-out "$OUT/w4.json" 2>&1 | tail -20 | tee "$OUT/w4.log"
timeout 150 python3 benchmarks/throughput.py --workload W2 --json-out "$OUT/w2.json" 2>&1 | tail -20 | tee "$OUT/w2.log"
