"""What runs inside one replica (a spawned process or a Ray actor): an AsyncLLM, commands in,
outputs and stats out through an ``Outbox``.

``handle`` takes the router's messages from any thread; each added request goes to the
engine with ``AsyncLLM.add_request_to_sink``, whose sink puts a whole step's outputs in the
outbox at once on the engine thread: no task, queue or event-loop wake-up per request and
token, which at hundreds of streams cost the engine process more than its step (an abort
that overtakes its add, as calls to a threaded Ray actor may, is remembered). ``take`` hands the transport the next
batch, with a stats snapshot (the heartbeat) every ``STATS_INTERVAL_S``; the heartbeat also
says for how long the engine has had requests without finishing a step, so the router can
tell a stuck engine from a busy one. If the engine dies for good, the replica exits
(``on_fatal``) and the router restarts it.
"""

from __future__ import annotations

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
        self._lock = threading.Lock()
        # Requests the router still waits on -> whether their first output went out (later
        # outputs travel without the prompt: "more" messages).
        self._live: dict[str, bool] = {}
        self._early_aborts: OrderedDict[str, None] = OrderedDict()
        self._next_stats = 0.0
        # Set by a transport that can take a step's outputs on the engine thread (a process
        # replica's pipe); else they go through the outbox to its sender.
        self.direct_send: Callable[[list], None] | None = None
        self.pipe_writer = None  # a process replica's PipeWriter (its counts are logged)
        self._started = time.monotonic()
        self._period = [self._started, self._started, 0, 0.0]
        from octavo import envs
        from octavo.startup_heap import freeze_startup_heap

        freeze_startup_heap()  # a replica's process serves from here on
        self._gc = None
        if envs.log_step_timings():  # the collector's share, logged with the step timings
            from octavo.metrics.gc_timer import GcTimer

            self._gc = GcTimer()
        self.outbox.put(("ready", {"pid": os.getpid()}))

    # ------------------------------------------------------------------ commands
    def handle(self, msg: tuple) -> None:
        """One message from the router (any thread)."""
        kind = msg[0]
        if kind == "add":
            self._start(*msg[1:])
        elif kind == "abort":
            self._cancel(msg[1])
        else:
            raise ValueError(f"unknown replica message {kind!r}")

    def _start(self, request_id, prompt, params, priority, group_id) -> None:
        with self._lock:
            if request_id in self._early_aborts:
                del self._early_aborts[request_id]
                return
            if request_id in self._live:
                self.outbox.put(("fail", request_id, "invalid",
                                 f"request_id {request_id!r} is already in use", None))
                return
            now = time.monotonic()
            if not self._live:  # busy from now: the step clock runs from here
                self._clock.last = now
                # [first add, last add, adds, the engine's step seconds then]: the busy
                # period's arrivals, logged with the step timings.
                self._period = [now, now, 0, self.llm.engine.timings.wall_s]
            self._period[1] = now
            self._period[2] += 1
            self._live[request_id] = False
            # Queued under the lock: an abort from another thread comes after it.
            try:
                fut = self.llm.add_request_to_sink(request_id, prompt, params, self._sink,
                                                   priority=priority, group_id=group_id,
                                                   plain_deltas=True)
            except Exception as e:  # noqa: BLE001 - the engine is dead: reported by request
                fut, error = None, e
        if fut is None:
            self._refused(request_id, error)
            return
        fut.add_done_callback(lambda f: f.exception() is not None and self._refused(
            request_id, f.exception()))

    def _refused(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            if self._live.pop(request_id, None) is None:
                return  # aborted meanwhile
        self.outbox.put(fail_message(request_id, error))

    def _cancel(self, request_id: str) -> None:
        with self._lock:
            if self._live.pop(request_id, None) is None:
                # Not started (its add comes later) or finished already; remember it briefly.
                self._early_aborts[request_id] = None
                while len(self._early_aborts) > _MAX_EARLY_ABORTS:
                    self._early_aborts.popitem(last=False)
                return
        self.llm.abort(request_id)

    def _sink(self, items: list) -> None:
        """On the engine thread, once per step: every output of the step, as one outbox
        put. After a request's first output, the prompt (its ids, text, timings) stays
        behind: the router has it."""
        msgs = []
        with self._lock:
            live = self._live
            for request_id, item in items:
                sent = live.get(request_id)
                if sent is None:
                    continue  # aborted meanwhile
                if item.__class__ is tuple:  # a StepDelta, built so by the engine
                    msgs.append(("delta", request_id, item[1], item[2], item[3]))
                    continue
                if isinstance(item, BaseException):
                    del live[request_id]
                    msgs.append(fail_message(request_id, item))
                    continue
                if item.finished:
                    del live[request_id]
                elif not sent:
                    live[request_id] = True
                if not sent:
                    msgs.append(("out", request_id, item))
                    continue
                comp = item.outputs[0] if len(item.outputs) == 1 else None
                if (comp is not None and not item.finished and comp.finish_reason is None
                        and comp.logprobs is None
                        and comp.cumulative_logprob is None and item.prompt_logprobs is None
                        and item.error is None):
                    # The common step output: plain values, no objects to pickle.
                    msgs.append(("delta", request_id, comp.index, comp.text,
                                 comp.token_ids))
                    continue
                item.prompt = item.prompt_token_ids = None
                if not item.finished:
                    item.metrics = None
                msgs.append(("more", request_id, item))
        if msgs:
            send = self.direct_send
            if send is not None:
                send(msgs)
            else:
                self.outbox.put_many(msgs)

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
            stuck = now - self._clock.last if self._live else 0.0
            try:
                batch.append(("stats", snapshot(self.registry) if self.registry else [],
                              stuck))
            except Exception:  # noqa: BLE001 - a metrics bug must not stop the heartbeat
                logger.exception("replica stats snapshot failed")
                batch.append(("stats", [], stuck))
        return batch

    def shutdown(self) -> None:
        from octavo import envs

        if envs.log_step_timings():
            import json

            summary = self.llm.engine.timings.summary()
            summary["alive_s"] = time.monotonic() - self._started
            summary["in_steps_s"] = self.llm.engine.timings.wall_s
            # The last busy period (from an add to an idle engine): how long its requests
            # took to arrive, and how much of it the engine spent outside its steps.
            first, last, adds, steps0 = self._period
            summary["last_period"] = {
                "adds": adds, "add_span_s": last - first,
                "to_last_step_s": self._clock.last - first,
                "in_steps_s": self.llm.engine.timings.wall_s - steps0}
            if self._gc is not None:
                self._gc.stop()
                summary.update(self._gc.summary())
            if self.pipe_writer is not None:
                summary["batches_sent"] = self.pipe_writer.num_sent
                summary["batches_queued_on_a_full_pipe"] = self.pipe_writer.num_queued
            logger.warning("replica %d step timings: %s", self.spec.index, json.dumps(summary))
        self.llm.shutdown()
