"""What runs inside one replica (a spawned process or a Ray actor): an AsyncLLM on an event
loop of its own, commands in, outputs and stats out through an ``Outbox``.

``handle`` takes the router's messages from any thread; each added request becomes a task on
the replica's loop that iterates ``AsyncLLM.generate`` and puts every output in the outbox
(an abort cancels the task, which aborts the request; an abort that overtakes its add, as
calls to a threaded Ray actor may, is remembered). ``take`` hands the transport the next
batch, with a stats snapshot (the heartbeat) every ``STATS_INTERVAL_S``; the heartbeat also
says for how long the engine has had requests without finishing a step, so the router can
tell a stuck engine from a busy one. If the engine dies for good, the replica exits
(``on_fatal``) and the router restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from octavo.replicas.messages import STATS_INTERVAL_S, Outbox, ReplicaSpec, fail_message
from octavo.replicas.metrics import snapshot

logger = logging.getLogger(__name__)

_MAX_EARLY_ABORTS = 10_000


class _StepClock:
    """A StatLogger that only notes when the engine last finished a step."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def record(self, stats, num_new_preemptions: int, finished) -> None:
        self.last = time.monotonic()


class ReplicaCore:
    def __init__(self, spec: ReplicaSpec, on_fatal: Callable[[BaseException], None]) -> None:
        from octavo.engine.async_llm import AsyncLLM

        self.spec = spec
        self.outbox = Outbox()
        self.llm = AsyncLLM.from_engine_args(spec.engine_args)
        self.llm.fatal_callbacks.append(on_fatal)
        self._clock = _StepClock()
        self.llm.stat_loggers.append(self._clock)
        self.registry = None
        try:
            from octavo.metrics.prometheus import PrometheusStatLogger
        except ImportError:  # prometheus_client missing: no metrics, the replica still serves
            pass
        else:
            exporter = PrometheusStatLogger(self.llm.engine, spec.model_name)
            self.llm.stat_loggers.append(exporter)
            self.registry = exporter.registry
        if spec.log_stats_interval is not None:
            from octavo.metrics.log_stats import LoggingStatLogger

            self.llm.stat_loggers.append(LoggingStatLogger(
                self.llm.engine, spec.log_stats_interval,
                log=logging.getLogger(f"octavo.replica{spec.index}")))
        self.loop = asyncio.new_event_loop()
        self._tasks: dict[str, asyncio.Task] = {}
        self._early_aborts: OrderedDict[str, None] = OrderedDict()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="octavo-replica-loop", daemon=True)
        self._thread.start()
        self._next_stats = 0.0
        self.outbox.put(("ready", {"pid": os.getpid()}))

    # ------------------------------------------------------------------ commands
    def handle(self, msg: tuple) -> None:
        """One message from the router (any thread)."""
        kind = msg[0]
        if kind == "add":
            self.loop.call_soon_threadsafe(self._start, *msg[1:])
        elif kind == "abort":
            self.loop.call_soon_threadsafe(self._cancel, msg[1])
        else:
            raise ValueError(f"unknown replica message {kind!r}")

    def _start(self, request_id, prompt, params, priority, group_id) -> None:
        if request_id in self._early_aborts:
            del self._early_aborts[request_id]
            return
        if not self._tasks:  # busy from now: the step clock runs from here
            self._clock.last = time.monotonic()
        if request_id in self._tasks:
            self.outbox.put(("fail", request_id, "invalid",
                             f"request_id {request_id!r} is already in use"))
            return
        self._tasks[request_id] = self.loop.create_task(
            self._run(request_id, prompt, params, priority, group_id))

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()
            return
        # Not started (its add comes later) or finished already; remember it briefly.
        self._early_aborts[request_id] = None
        while len(self._early_aborts) > _MAX_EARLY_ABORTS:
            self._early_aborts.popitem(last=False)

    async def _run(self, request_id, prompt, params, priority, group_id) -> None:
        try:
            async for out in self.llm.generate(prompt, params, request_id, priority=priority,
                                               group_id=group_id):
                self.outbox.put(("out", request_id, out))
        except asyncio.CancelledError:
            pass  # aborted by the router: generate() aborted the request
        except Exception as e:  # noqa: BLE001 - reported to the router, by request
            self.outbox.put(fail_message(request_id, e))
        finally:
            self._tasks.pop(request_id, None)

    # ------------------------------------------------------------------ out
    def take(self, timeout: float = STATS_INTERVAL_S) -> list:
        """The next batch for the router: outputs so far (waiting up to ``timeout`` for one),
        and a stats snapshot when one is due."""
        now = time.monotonic()
        batch = self.outbox.take(max(0.0, min(timeout, self._next_stats - now)))
        now = time.monotonic()
        if now >= self._next_stats:
            self._next_stats = now + STATS_INTERVAL_S
            # Seconds the engine has had requests without finishing a step (0 when idle).
            stuck = now - self._clock.last if self._tasks else 0.0
            try:
                batch.append(("stats", snapshot(self.registry) if self.registry else [],
                              stuck))
            except Exception:  # noqa: BLE001 - a metrics bug must not stop the heartbeat
                logger.exception("replica stats snapshot failed")
                batch.append(("stats", [], stuck))
        return batch

    def shutdown(self) -> None:
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
