. scripts/device_items.sh
TAILN=4 item t_route python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py tests/kernels/test_swapab_mma.py -k "16_row_launches or every_batch or writes_into_rows or past_16_rows or split_and_cta or matches_the_float64"
TAILN=10 item q_final python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 8 16 32 64 --skip-w2 --json /tmp/res/q_final.json
TAILN=10 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --stall-stacks --json-out /tmp/res/w1_pen3.json
echo "=== end $(date +%T)"
