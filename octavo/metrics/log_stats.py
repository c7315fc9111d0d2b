"""The periodic stats line servers log (``--metric-interval N``; ``--disable-log-stats`` turns it
off), as vLLM's: throughput over the interval, queue lengths, KV cache usage, prefix-cache hits.

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.1 tokens/s,
    Running: 4 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%

`LoggingStatLogger` is an AsyncLLM StatLogger: ``record`` runs on the engine thread after every
step, so it only adds a few integers and reads the clock there; the line is formatted and logged
at most once per interval, by the first step past it. An idle engine takes no steps and logs
nothing (vLLM keeps an idle server quiet too); the first line after an idle gap averages its
throughput over the whole gap, which is what the engine did in that time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.engine.async_llm import FinishedRequestStats
    from octavo.engine.llm_engine import LLMEngine, StepStats

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0  # vLLM's default


class LoggingStatLogger:
    """Logs one stats line at most every ``interval`` seconds of ``clock``."""

    def __init__(self, engine: LLMEngine, interval: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger = logger) -> None:
        if not interval > 0:
            raise ValueError(f"the stats interval must be positive, got {interval}")
        self.engine = engine
        self.interval = float(interval)
        self.clock = clock
        self.log = log
        self._start = clock()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._preemptions = 0
        self._hits, self._queries = self._prefix_totals()

    def _prefix_totals(self) -> tuple[int, int]:
        # Read through engine.scheduler each time: a restart replaces the scheduler (and its
        # KV manager, whose running totals start again from zero).
        kv = self.engine.scheduler.kv
        return kv.prefix_hits, kv.prefix_queries

    def record(self, stats: StepStats | None, num_new_preemptions: int,
               finished: list[FinishedRequestStats]) -> None:
        if stats is not None:
            self._prompt_tokens += stats.num_prompt_tokens
            self._generation_tokens += stats.num_generation_tokens
        self._preemptions += num_new_preemptions
        now = self.clock()
        if now - self._start >= self.interval:
            self._emit(now, stats)

    def _emit(self, now: float, stats: StepStats | None) -> None:
        elapsed = now - self._start
        hits, queries = self._prefix_totals()
        if hits < self._hits or queries < self._queries:  # a restart zeroed the totals
            self._hits = self._queries = 0
        d_hits, d_queries = hits - self._hits, queries - self._queries
        running = stats.num_running if stats is not None else len(self.engine.scheduler.running)
        waiting = stats.num_waiting if stats is not None else len(self.engine.scheduler.waiting)
        usage = stats.kv_cache_usage if stats is not None else self.engine.scheduler.kv.usage
        line = (f"Avg prompt throughput: {self._prompt_tokens / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {self._generation_tokens / elapsed:.1f} tokens/s, "
                f"Running: {running} reqs, Waiting: {waiting} reqs, "
                f"KV cache usage: {100.0 * usage:.1f}%, "
                f"Prefix cache hit rate: {100.0 * d_hits / d_queries if d_queries else 0.0:.1f}%")
        if self._preemptions:
            line += f", Preemptions: {self._preemptions}"
        self.log.info(line)
        self._start = now
        self._prompt_tokens = self._generation_tokens = self._preemptions = 0
        self._hits, self._queries = hits, queries
