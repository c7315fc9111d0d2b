. scripts/device_items.sh
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader

TAILN=6 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
TAILN=9 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=9 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --json-out /tmp/res/w1_lp.json
echo "=== end $(date +%T)"
