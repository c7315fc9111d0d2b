# call 3 (same warm machine)
. scripts/device_items.sh; BUDGET=100; TAILN=12 item w1c python benchmarks/throughput.py --workload W1 --stall-stacks --json-out /tmp/res/w1c.json; grep -h "output tok/s" /tmp/res/w1c.log
