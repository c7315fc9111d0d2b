# Sourced by a device call's script (docs/results/*/next_session_script.sh): the environment
# and ``item NAME CMD...``, which runs CMD under what is left of BUDGET seconds (default 570,
# counted from the sourcing), logs it to /tmp/res/NAME.log, prints its exit status and the
# last TAILN lines (default 6), and packs /tmp/res into $OUT/res.tgz after every item, so a
# call cut short still brings back what ran (the device returns at most 8 files).
set -u
export OCTAVO_CACHE_DIR=$PWD/.snap/cache PYTHONPATH=.
START=$(date +%s)
BUDGET=${BUDGET:-570}
mkdir -p /tmp/res
item() {
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ $left -lt 40 ]; then echo "skip $1 (budget)"; return; fi
    echo "=== $1 $(date +%T)"
    local name=$1
    shift
    local t0=$(date +%s)
    timeout -k 5 $left "$@" > /tmp/res/$name.log 2>&1
    echo "rc=$? ($(($(date +%s) - t0)) s)"
    grep -v "^RESULT_JSON" /tmp/res/$name.log | grep -v Warning | tail -${TAILN:-6}
    tar czf $OUT/res.tgz -C /tmp res
}
# ``install_wheels DEST WHEEL...``: carried wheels (no index, no dependencies) into DEST, for
# PYTHONPATH; pip's output goes to /tmp/res/pip.log, its exit status is printed.
install_wheels() {
    local dest=$1
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$dest" "$@" >> /tmp/res/pip.log 2>&1
    echo "pip into $dest: rc=$?"
}
