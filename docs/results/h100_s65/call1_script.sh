# Session 65 call 1: W3 diagnosis (step timings + py-spy, h11 as in s64 call 2), then W3 with
# httptools, then on an H200 issue 12's table / W1 / W2, then the large-batch kernel GPU tests.
export BUDGET=${BUDGET:-560}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
mkdir -p /tmp/w_h11 /tmp/w_ht; cp .whl/*.whl /tmp/w_h11/; rm /tmp/w_h11/httptools*; cp .whl/httptools*.whl /tmp/w_ht/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/w_h11/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_ht /tmp/w_ht/*.whl >> /tmp/res/pip.log 2>&1; echo "pip ht rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spy .snap/spy/*.whl >> /tmp/res/pip.log 2>&1; echo "spy rc=$? $(ls /tmp/spy/bin)"
python3 -c "import uvloop; print('uvloop', uvloop.__version__)"; PYTHONPATH=/tmp/site python3 -c "import httptools" 2>&1 | tail -1
(
  for i in $(seq 1 300); do
    grep -q "replicas ready" /tmp/res/w3a.log 2>/dev/null && break; sleep 0.5
  done
  SP=$(pgrep -f "octavo.entrypoints.openai.api_server" | head -1)
  echo "py-spy on $SP" > /tmp/res/spy.log
  /tmp/spy/bin/py-spy record --subprocesses --threads --idle --nonblocking --rate 50 --duration 40 \
      --format raw -o /tmp/res/spy.txt --pid $SP >> /tmp/res/spy.log 2>&1
) &
OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=/tmp/site:. TAILN=14 item w3a python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3a.json
grep -h "step timings" /tmp/res/w3a.log | tail -4
wait
tail -3 /tmp/res/spy.log
tar czf $OUT/res.tgz -C /tmp res
PYTHONPATH=/tmp/site_ht:/tmp/site:. TAILN=6 item w3b python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3b.json
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json ;;
esac
TAILN=3 item t_wg timeout 200 python -m pytest -m gpu -q -rf tests/kernels/test_swapab_wgmma.py tests/kernels/test_swapab_wgmma_8bit.py
echo "=== end $(date +%T)"
