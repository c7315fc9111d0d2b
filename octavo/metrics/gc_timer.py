"""Time spent in the garbage collector, by generation (benchmarks' step-timing logs: a
full collection in a serving process stalls every stream)."""

from __future__ import annotations

import gc
import threading
import time


class GcTimer:
    def __init__(self, thread: int | None = None) -> None:
        """``thread``: count only the collections run on that thread
        (``threading.get_ident()``), e.g. an event loop's; None: every thread's."""
        self._thread = thread
        self.reset()
        self._start: float | None = None
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_s = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if self._thread is not None and threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            took = time.perf_counter() - self._start
            self._start = None
            g = info["generation"]
            self.collections[g] += 1
            self.seconds[g] += took
            self.longest_s = max(self.longest_s, took)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"gc_collections": list(self.collections),
                "gc_ms": [round(1e3 * s, 1) for s in self.seconds],
                "gc_longest_ms": round(1e3 * self.longest_s, 1)}
