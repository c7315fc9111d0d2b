. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
TAILN=3 item t_pen python -m pytest -q -rf tests/test_penalty_rows.py tests/kernels/test_penalties.py tests/test_sampler_profile.py tests/test_flat_logprobs.py
TAILN=6 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=9 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=9 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
echo "=== end $(date +%T)"
