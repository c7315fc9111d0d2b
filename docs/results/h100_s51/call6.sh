. scripts/device_items.sh
TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1_f.json
TAILN=8 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --stall-stacks --json-out /tmp/res/w1_pen_f.json
TAILN=8 item w1_lp python benchmarks/throughput.py --workload W1 --logprobs 5 --stall-stacks --json-out /tmp/res/w1_lp_f.json
echo "=== end $(date +%T)"
