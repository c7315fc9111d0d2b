. scripts/device_items.sh
TAILN=4 item gpu_tests python -m pytest -m gpu -q -rf tests/test_device_upload.py tests/kernels/test_sample_race.py
TAILN=4 item pen_tests python -m pytest -q -rf tests/test_penalty_rows.py tests/test_logits_processors.py tests/test_async_scheduling.py
TAILN=5 item w1_pen python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen.json
TAILN=5 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
PYTHONPATH=.snap/old:. TAILN=5 item w1_pen_old python benchmarks/throughput.py --workload W1 --penalties --json-out /tmp/res/w1_pen_old.json
TAILN=8 item sync_pen python benchmarks/host_syncs.py --penalties --logit-bias --json /tmp/res/sync_pen.json
echo "=== end $(date +%T)"
