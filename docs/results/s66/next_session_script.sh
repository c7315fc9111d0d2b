# The next session's first device call (copy to .snap/, carry [".snap", ".whl"]; ~8 minutes
# with its start). Session 66 got no machine (every start refused), so nothing below has run
# on a GPU yet. Before it, here: .whl as session 65 had it (fastapi 0.165.0, starlette
# 1.10.0, pydantic 2.14.4, pydantic_core 2.50.5, typing-inspection 0.4.5, uvicorn 0.55.0,
# annotated-types, annotated-doc, opentelemetry-api 1.45.3, httptools 0.9.0) and
# .whl/uvloop/uvloop-0.23.0-cp312-*.whl, downloaded as the device README says.
# W3 at HEAD (the handler-side send on by default since session 66; router-to-engine sends
# through a PipeWriter; prompt ids checked in C loops; the API process's young collections
# every 50,000 allocations), ~100 s a run, h11:
#   a  the defaults
#   b  OCTAVO_SERVER_EAGER_SEND=0 (the lazy send, as sessions 64-65 measured 81-92%)
#   c  the defaults + the client's --preconnect (connections opened before the clock)
#   d  c + uvloop importable (uvicorn's loop "auto" picks it, as uvicorn[standard] does)
# Read: the ratio, "from the start, s: ... first tokens: first" (1.04 / 1.37 s in session
# 65) and the engine's last busy period (adds, add_span_s, to_last_step_s, in_steps_s).
# Then, on an H200: W1, W2 and issue 12's table.
export BUDGET=${BUDGET:-570}
. scripts/device_items.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
rm -rf /tmp/res; mkdir -p /tmp/res
mkdir -p /tmp/w_h11; cp .whl/*.whl /tmp/w_h11/; rm -f /tmp/w_h11/httptools*
install_wheels /tmp/site /tmp/w_h11/*.whl
install_wheels /tmp/site_uvloop .whl/uvloop/*.whl
for r in a b c d; do
  case $r in b) E=0 ;; *) E=1 ;; esac
  case $r in c|d) P=--preconnect ;; *) P= ;; esac
  case $r in d) PP=/tmp/site_uvloop:/tmp/site:. ;; *) PP=/tmp/site:. ;; esac
  OCTAVO_SERVER_EAGER_SEND=$E OCTAVO_LOG_STEP_TIMINGS=1 PYTHONPATH=$PP TAILN=9 item w3$r python benchmarks/serving_vs_offline.py --rates inf $P --json /tmp/res/w3$r.json
  grep -h "step timings" /tmp/res/w3$r.log | tail -1 | grep -o '"last_period": {[^}]*}'
done
case "$GPU" in *H200*)
  TAILN=3 item w1 python benchmarks/throughput.py --workload W1 --json-out /tmp/res/w1.json
  TAILN=3 item w2 python benchmarks/throughput.py --workload W2 --json-out /tmp/res/w2.json
  TAILN=8 item q python benchmarks/quantized.py --json /tmp/res/q.json ;;
esac
echo "=== end $(date +%T)"
