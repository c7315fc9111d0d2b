"""benchmarks/common.py StackSampler and throughput.py's slow-step stacks: the host's stacks
inside a slow step name where it waited."""

from __future__ import annotations

import time
from types import SimpleNamespace

from benchmarks.common import StackSampler
from benchmarks.throughput import slow_step_stacks


def _stalls_here(seconds: float) -> None:
    time.sleep(seconds)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_slow_step_stacks_name_the_stalling_function():
    trace = []
    with StackSampler(interval=0.002) as stacks:
        for fn, seconds in ((_busy, 0.03), (_stalls_here, 0.15), (_busy, 0.03)):
            t0 = time.perf_counter()
            fn(seconds)
            trace.append(SimpleNamespace(start_s=t0, wall_s=time.perf_counter() - t0))
    slow = slow_step_stacks(trace, stacks, count=1)
    assert [s["step"] for s in slow] == [1]
    top = slow[0]["stacks"][0]
    assert top["samples"] >= 10
    assert "_stalls_here" in top["stack"][0] and "test_stack_sampler.py" in top["stack"][0]
    # Nothing sampled outside the window counts in it.
    assert all("_busy" not in " ".join(s["stack"]) for s in slow[0]["stacks"])
    assert stacks.during(0.0, 1.0) == []


def test_garbage_collections_inside_a_step_are_listed():
    import gc

    with StackSampler(interval=0.002) as stacks:
        t0 = time.perf_counter()
        gc.collect()
        t1 = time.perf_counter()
    trace = [SimpleNamespace(start_s=t0, wall_s=t1 - t0)]
    (slow,) = slow_step_stacks(trace, stacks, count=1)
    assert [c["generation"] for c in slow["gc"]] == [2] and slow["gc"][0]["ms"] >= 0
    assert gc.callbacks.count(stacks._on_gc) == 0  # removed on exit
