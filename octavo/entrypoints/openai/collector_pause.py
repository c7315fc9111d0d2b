"""The cyclic garbage collector paused while a large request body is parsed.

``json.loads`` of a body of nested lists builds millions of containers in one C call that
holds the GIL (a worker thread does not let the event loop in meanwhile). Each few hundred
of them trigger a collection, and every so often a full one walks all of them built so
far, to find nothing: a parsed JSON document holds no reference cycle. In a serving
process (its startup heap frozen) 8 MB of ``[[0],[0],...]`` took ~0.7 s to parse; paused,
~0.18 s.

The collector is process-wide, so pauses are counted: it is enabled again when the last of
overlapping pauses ends, and only if it was enabled when the first began. A stretch of
overlapping pauses (a client sending large bodies back to back) keeps it off for at most
about ``MAX_PAUSE_S`` seconds: a pause that ends later enables it, and no pause disables it
again until none is running.
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager

MAX_PAUSE_S = 1.0

_lock = threading.Lock()
_running = 0  # pauses in progress
_since = 0.0  # when the collector was disabled
_resume = False  # whether the collector is to be enabled again (it was on, and is off now)


@contextmanager
def collector_paused():
    """The collector disabled for the block (see the module's docstring). Objects built
    inside that are still alive after it are collected as usual from then on; garbage
    freed inside costs the collector nothing."""
    global _running, _since, _resume
    with _lock:
        if _running == 0 and gc.isenabled():
            gc.disable()
            _since, _resume = time.monotonic(), True
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _resume and (_running == 0 or time.monotonic() - _since > MAX_PAUSE_S):
                gc.enable()
                _resume = False
