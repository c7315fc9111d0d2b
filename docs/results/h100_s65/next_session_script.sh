# The next session's first device call (copy to .snap/, carry [".snap", ".whl"]; about 5-7
# minutes with its start). Before it, here: .whl as session 65 had it (fastapi 0.165.0,
# starlette 1.10.0, pydantic 2.14.4, pydantic_core 2.50.5, typing-inspection 0.4.5, uvicorn
# 0.55.0, annotated-types, annotated-doc, opentelemetry-api 1.45.3, httptools), downloaded as
# the device README says.
# Session 65 measured W3's burst losing ~0.9 s before its first request reached the engine
# process (the handler yielded twice before sending: 250baaf, 3203fb1 can send it from the
# handler, behind OCTAVO_SERVER_EAGER_SEND, off) but had no device time left to run W3 on
# that code. Four W3 runs at HEAD, alternating the knob (~100 s each), h11 as
# session 65's calls 1 and 3 ran it (92.2%, 90.3% of offline, and 88.2%, 83.3% with
# httptools): the ratio, and "from the start, s: ... first tokens: first" (1.04 / 1.37 s
# before) with the engine's last busy period. Then, on an H200, issue 12's table, W1, W2.
export BUDGET=${BUDGET:-540}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
mkdir -p /tmp/w_h11; cp .whl/*.whl /tmp/w_h11/; rm -f /tmp/w_h11/httptools*
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/w_h11/*.whl > /tmp/res/pip.log 2>&1; echo "pip rc=$?"
# a, c: the default (lazy send); b, d: OCTAVO_SERVER_EAGER_SEND=1 (sent from the handler).
for r in a b c d; do
  case $r in b|d) E=1 ;; *) E=0 ;; esac
  OCTAVO_SERVER_EAGER_SEND=$E OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=/tmp/site:. TAILN=9 item w3$r python benchmarks/serving_vs_offline.py --rates inf --json /tmp/res/w3$r.json
  grep -h "step timings" /tmp/res/w3$r.log | tail -1 | grep -o '"last_period": {[^}]*}'
done
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json ;;
esac
echo "=== end $(date +%T)"
