. scripts/device_items.sh
TAILN=4 item t_route python -m pytest -m gpu -q -rf tests/quantization/test_int_weight_layout.py tests/kernels/test_swapab_mma.py -k "16_row_launches or every_batch or writes_into_rows or past_16_rows or split_and_cta"
TAILN=14 item q_new python benchmarks/quantized.py --methods bf16,w4a16 --batches 1 16 32 64 128 --json /tmp/res/q_new.json
TAILN=12 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --stall-stacks --json-out /tmp/res/w1_pen.json
TAILN=12 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --stall-stacks --json-out /tmp/res/w1_lp.json
OCTAVO_PDL=0 TAILN=14 item prof_l16 python benchmarks/profile_step.py --shape llama-3.1-8b --batch 16 --context 256 --quantization w4a16 --json /tmp/res/prof_l16.json
OCTAVO_PDL=0 TAILN=14 item prof_l1 python benchmarks/profile_step.py --shape llama-3.1-8b --batch 1 --context 256 --quantization w4a16 --json /tmp/res/prof_l1.json
echo "=== end $(date +%T)"
