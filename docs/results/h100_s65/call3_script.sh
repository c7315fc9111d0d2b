# Session 65 call 3: W3 at rate inf twice more, with the burst's timeline (serving.py) and the
# engine process's last busy period (OCTAVO_LOG_STEP_TIMINGS): where the server's time goes
# against offline. Run a: h11 (uvicorn without httptools); run b: httptools.
export BUDGET=${BUDGET:-400}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
mkdir -p /tmp/w_h11 /tmp/w_ht; cp .whl/*.whl /tmp/w_h11/; rm /tmp/w_h11/httptools*; cp .whl/httptools*.whl /tmp/w_ht/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/w_h11/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_ht /tmp/w_ht/*.whl >> /tmp/res/pip.log 2>&1; echo "pip ht rc=$?"
OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=/tmp/site:. TAILN=8 item w3a python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3a.json
grep -h "step timings" /tmp/res/w3a.log | tail -2
OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=/tmp/site_ht:/tmp/site:. TAILN=8 item w3b python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3b.json
grep -h "step timings" /tmp/res/w3b.log | tail -2
echo "=== end $(date +%T)"
