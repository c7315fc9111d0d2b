"""freeze_startup_heap: a serving process's startup objects leave the collector's reach
(gc.freeze), unless OCTAVO_FREEZE_STARTUP_HEAP=0. Run in a child process: freezing pytest's
own heap would keep later tests' garbage alive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import gc
from octavo.startup_heap import freeze_startup_heap
startup = [[i] for i in range(1000)]
freeze_startup_heap()
print(gc.get_freeze_count())
"""


@pytest.mark.parametrize("flag, frozen", [(None, True), ("0", False)])
def test_freeze_startup_heap(flag, frozen):
    env = dict(os.environ)
    env.pop("OCTAVO_FREEZE_STARTUP_HEAP", None)
    if flag is not None:
        env["OCTAVO_FREEZE_STARTUP_HEAP"] = flag
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert (int(out.strip()) >= 1000) == frozen


def test_gc_timer_counts_collections_by_generation():
    import gc

    from octavo.metrics.gc_timer import GcTimer

    timer = GcTimer()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        timer.stop()
    s = timer.summary()
    assert s["gc_collections"][2] >= 1 and s["gc_collections"][0] >= 1
    assert s["gc_longest_ms"] >= 0 and timer._callback not in gc.callbacks
