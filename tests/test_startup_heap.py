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


RUN_CHILD = """
import gc, sys, time
sys.path.insert(0, "benchmarks")
from workloads import write_config
from octavo import LLM, SamplingParams

llm = LLM(model=write_config("tiny-qwen3"), load_format="dummy", skip_tokenizer_init=True,
          max_model_len=256)
seen = []
step = llm.llm_engine.step
def counted_step():
    seen.append(gc.get_freeze_count())
    return step()
llm.llm_engine.step = counted_step
startup = gc.get_freeze_count()
outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 3,
                    SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
after = gc.get_freeze_count()
gc.freeze()  # something else froze: generate leaves that alone
outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                    use_tqdm=False)
print(startup, min(seen[:5]), after, gc.get_freeze_count() > 0, len(outs))
"""


@pytest.mark.parametrize("flag", [None, "0"])
def test_an_offline_run_freezes_the_heap_until_it_ends(flag):
    """LLM.generate's loop runs with the objects alive at its start frozen (no full
    collection walks them: 148 ms on this CPU) and unfreezes them after,
    so nothing stays out of the collector's reach; already-frozen objects are left frozen."""
    env = dict(os.environ)
    env.pop("OCTAVO_FREEZE_STARTUP_HEAP", None)
    if flag is not None:
        env["OCTAVO_FREEZE_STARTUP_HEAP"] = flag
    out = subprocess.run([sys.executable, "-c", RUN_CHILD], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__)))).stdout.split()
    startup, during, after, still, n = int(out[0]), int(out[1]), int(out[2]), out[3], out[4]
    assert startup == 0 and after == 0 and still == "True" and n == "1"
    assert (during > 10000) == (flag is None)
