"""Keep the startup heap out of the garbage collector's way in serving processes.

A serving engine allocates containers every step (its outputs, their token lists, the
transport's messages), so the collector runs often; now and then a full (oldest
generation) collection walks every tracked object, the hundreds of thousands built at
startup (modules, parameters' wrappers, the tokenizer's tables) included. On the CPU proxy
one such pass took 200-300 ms of an engine process's thread, a stall of every stream,
every few hundred steps (offline generation allocates little per step and rarely meets
one). ``gc.freeze`` after startup moves those objects to a permanent generation that
collections skip; what is garbage at that point is collected first. vLLM does the same.

The OpenAI server's process also collects its young generation less often
(``tune_collector_for_serving``): each request there holds its prompt's id list for the
request's life, and Python's default threshold (700 allocations, a handler's worth) made
the older generations' passes walk every in-flight prompt again and again during a burst.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager

logger = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Collect, then freeze every object alive now (see the module's docstring). Only for
    a process that serves from here on: a frozen object that later becomes garbage is never
    collected. OCTAVO_FREEZE_STARTUP_HEAP=0 turns it off."""
    from octavo import envs

    global _serving_frozen
    if not envs.freeze_startup_heap():
        return
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    _serving_frozen = True
    logger.debug("froze %d startup objects in %.0f ms", gc.get_freeze_count(),
                 1e3 * (time.perf_counter() - t0))


def tune_collector_for_serving() -> None:
    """Young collections every OCTAVO_SERVER_GC_GEN0 allocations (the other thresholds as
    Python has them); 0 leaves Python's. For the API server's process, after
    ``freeze_startup_heap``."""
    from octavo import envs

    gen0 = envs.server_gc_gen0()
    if gen0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0, gen1, gen2)


_serving_frozen = False  # freeze_startup_heap ran in this process: it stays frozen
_depth = 0  # offline runs in progress (a nested one leaves the heap to the outermost)


@contextmanager
def heap_frozen_while_running():
    """For one offline run (``LLM.generate``'s engine loop, in the caller's process): the
    objects alive when it starts (the engine's startup heap, the caller's own) are frozen
    until it ends, then handed back to the collector (``gc.unfreeze``), so nothing becomes
    uncollectable. Without it a full collection inside the run walks them all (on this
    2-core CPU 148 ms with a tiny model's engine built, 6 ms frozen; on an H100 ~480k objects,
    221 ms: a stall of every request; runs asking for penalties or logprobs allocate enough
    to meet one). Objects some library froze before are frozen with the rest and handed back
    too (a library froze 375 on the H100's Python 3.12, and a no-op there left W1's runs
    with that stall). A no-op in a serving process (``freeze_startup_heap``), in a nested
    run, where the collector is off, or with OCTAVO_FREEZE_STARTUP_HEAP=0."""
    global _depth
    from octavo import envs

    if (not envs.freeze_startup_heap() or not gc.isenabled() or _serving_frozen
            or _depth):
        yield
        return
    _depth += 1
    gc.freeze()
    try:
        yield
    finally:
        _depth -= 1
        gc.unfreeze()
