# The next session's first device call (copy to .snap/, carry [".snap", ".whl"]; about 7-9
# minutes with its start). Before it, here:
#   .whl: fastapi 0.165.0, starlette 1.10.0, pydantic 2.14.4, pydantic_core 2.50.5,
#     typing-inspection 0.4.5, uvicorn 0.55.0, annotated-types, annotated-doc and
#     opentelemetry-api 1.45.3 (fastapi 0.165 imports it), downloaded as the device README says;
#   .snap/spy: the py-spy wheel (`python3 -m pip download --no-deps --only-binary=:all:
#     --python-version 3.12 --implementation cp --platform manylinux_2_5_x86_64 -d .snap/spy
#     py-spy==0.4.3`).
# Session 64 left W3's server at 81.4% of offline on an H100 (call 2) against session 12's
# 89.9-95.2% on an H200, with no regression visible on the CPU proxy. Run 1 says where the
# server's time goes: the engine process's step timings (time in steps against time alive)
# and py-spy over both server processes, idle frames included (summarize with
# `python scripts/spy_summary.py spy.txt`). Run 2 plain, for the spread.
# On an H200 (none since session 52): issue 12's table, W1, W2 first.
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
# Any card: the large-batch kernel's GPU tests at HEAD (9c9cc84's source compiles to the SASS
# call 1 ran; fd1cb23 moved the 8-bit tests to their own file).
TAILN=3 item t_wg timeout 180 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py tests/kernels/test_swapab_wgmma_8bit.py
case "$GPU" in *H200*)
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json ;;
esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spy .snap/spy/*.whl >> /tmp/res/pip.log 2>&1; echo "spy rc=$? $(ls /tmp/spy/bin)"
(
  for i in $(seq 1 300); do
    grep -q "replicas ready" /tmp/res/w3a.log 2>/dev/null && break; sleep 0.5
  done
  SP=$(pgrep -f "octavo.entrypoints.openai.api_server" | head -1)
  echo "py-spy on $SP" > /tmp/res/spy.log
  /tmp/spy/bin/py-spy record --subprocesses --threads --idle --nonblocking --rate 50 --duration 40 \
      --format raw -o /tmp/res/spy.txt --pid $SP >> /tmp/res/spy.log 2>&1
) &
OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=/tmp/site:. TAILN=12 item w3a python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3a.json
grep -h "step timings" /tmp/res/w3a.log | tail -3
wait
tail -3 /tmp/res/spy.log
PYTHONPATH=/tmp/site:. TAILN=4 item w3b python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3b.json
echo "=== end $(date +%T)"
