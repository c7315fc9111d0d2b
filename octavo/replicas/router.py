"""ReplicaRouter: N engine replicas behind the interface the servers use of an AsyncLLM.

``generate`` sends a request to the least-loaded ready replica (``policy``) and streams its
outputs back; ``abort`` reaches the replica that has it. When a replica dies, each of its
in-flight requests that has received no output yet is sent again to another replica (at most
``MAX_ATTEMPTS`` times in all); one that had output already fails with a RequestFailedError
naming the replica and why it died, since its client has seen part of an answer. Non-streamed
server requests (``FINAL_ONLY``) see no output before they finish, so they are always retried.
A request never waits forever: a replica that stops answering (``stall_timeout_s``) or whose
engine stops stepping while it has requests (``step_timeout_s``) is killed by the supervisor
(its requests then fail or retry), and a request that finds no ready replica for
``ready_wait_s`` fails.

Health, as ``/health`` reports it: the router is healthy while at least one replica is ready
(the endpoint can serve; a replica being restarted is shown in the report, not as a 503 that
would take the whole server out of a load balancer). It is dead once every replica has spent
its restart budget; then the fatal callbacks run (the server exits 1, as with one engine).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import EngineDeadError, abort_if_dropped
from octavo.engine.processor import PromptType
from octavo.errors import RequestFailedError
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.replicas.front import RouterFront
from octavo.replicas.messages import ReplicaSpec, fail_error
from octavo.replicas.policy import RoutingPolicy, prefix_key
from octavo.replicas.slot import ReplicaSlot
from octavo.replicas.supervisor import (
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STEP_TIMEOUT_S,
    Supervisor,
)
from octavo.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # sends of one request, the first included
DEFAULT_READY_WAIT_S = 120.0


@dataclass
class _Retry:
    """Put in a stream's queue: its replica died before any output; send it again."""

    reason: str


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    slot: ReplicaSlot | None = None
    handle: Any = None
    got_output: bool = False
    first: RequestOutput | None = None  # its prompt fields complete "more" outputs
    attempts: int = 0
    reasons: list[str] = field(default_factory=list)
    # start_request's abort of an iterator dropped unread; detached once it is read.
    unread: weakref.finalize | None = None


class ReplicaRouter:
    """Start ``num_replicas`` replicas of ``args`` (processes, or Ray actors when
    ``args.distributed_executor_backend == "ray"``) and wait until all are ready.
    ValueError for a bad configuration (before anything starts), RuntimeError when a
    replica cannot start. ``make_handle(spec)``: another kind of replica handle (tests)."""

    def __init__(self, args: EngineArgs, num_replicas: int, model_name: str | None = None,
                 log_stats_interval: float | None = None, log_level: int = logging.INFO,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
                 ready_wait_s: float = DEFAULT_READY_WAIT_S,
                 make_handle: Callable[[ReplicaSpec], Any] | None = None) -> None:
        check_num_replicas(num_replicas)
        config = args.create_engine_config()  # every engine check, before anything starts
        self.engine = RouterFront(config, self.shutdown)
        self.num_replicas = num_replicas
        self.backend = args.distributed_executor_backend or "mp"
        self.ready_wait_s = ready_wait_s
        self.stat_loggers: list = []  # the servers' loggers; replicas keep their own stats
        self.fatal_callbacks: list[Callable[[BaseException], None]] = []
        self._lock = threading.RLock()
        self._streams: dict[str, _Stream] = {}
        self._policy = RoutingPolicy()
        self._dead: BaseException | None = None
        self._block_size = config.cache_config.block_size
        tp = config.parallel_config.tensor_parallel_size
        on_gpu = config.device_config.device.startswith("cuda")
        # Each replica's own engine: one rank in the replica's process, or its TP ranks.
        inner = dataclasses.replace(args, distributed_executor_backend=(
            None if tp == 1 else args.distributed_executor_backend))
        name = model_name or config.model_config.served_model_name
        process_replicas = self.backend != "ray"  # Ray gives each actor its own share
        devices = _device_groups(num_replicas, tp) if on_gpu and process_replicas else None
        threads = _cpu_share(num_replicas * tp) if not on_gpu and process_replicas else None

        def new_handle(index: int):
            spec = ReplicaSpec(inner, index, name, log_stats_interval, log_level,
                               devices[index] if devices else None, threads)
            if make_handle is not None:
                return make_handle(spec)
            if self.backend == "ray":
                from octavo.replicas.ray_replica import RayReplica

                return RayReplica(spec, tp, on_gpu)
            from octavo.replicas.replica_process import ProcessReplica

            return ProcessReplica(spec)

        if self.backend == "ray" and make_handle is None:
            from octavo.replicas.ray_replica import check_cluster

            check_cluster(num_replicas, tp, on_gpu)
        self._supervisor = Supervisor(
            num_replicas, new_handle, self._lock, self._on_batch, self._on_death,
            self._on_all_failed, startup_timeout_s=startup_timeout_s,
            stall_timeout_s=stall_timeout_s, step_timeout_s=step_timeout_s)
        t0 = time.monotonic()
        self._supervisor.start_all()
        # A script that never calls shutdown() must still exit: stop the replicas first
        # (multiprocessing would wait at exit for a replica with TP workers, not a daemon).
        ref = weakref.ref(self)
        self._at_exit = lambda: (r := ref()) is not None and r.shutdown(5.0)
        atexit.register(self._at_exit)
        logger.info("%d replicas ready in %.1f s", num_replicas, time.monotonic() - t0)

    # ------------------------------------------------------------------ AsyncLLM's face
    @property
    def slots(self) -> list[ReplicaSlot]:
        return self._supervisor.slots

    @property
    def model_config(self):
        return self.engine.config.model_config

    def get_tokenizer(self):
        return self.engine.get_tokenizer()

    @property
    def errored(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> BaseException | None:
        return self._dead

    @property
    def is_running(self) -> bool:
        return self._dead is None

    @property
    def num_restarts(self) -> int:
        return sum(s.num_restarts for s in self.slots)

    def health_report(self) -> tuple[bool, list[dict[str, Any]]]:
        """(whether at least one replica is ready, every replica's state)."""
        with self._lock:
            report = [s.report() for s in self.slots]
        return any(r["state"] == "ready" for r in report) and self._dead is None, report

    def generate(self, prompt: PromptType, sampling_params: SamplingParams,
                 request_id: str, priority: int = 0,
                 group_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """As ``AsyncLLM.generate``, on one replica (see the module's docstring for what
        happens when it dies): the request goes out at the first iteration."""
        return self._outputs(prompt, sampling_params, request_id, priority, group_id, None)

    def start_request(self, prompt: PromptType, sampling_params: SamplingParams,
                      request_id: str, priority: int = 0,
                      group_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """``generate`` with the request sent to a ready replica now, before its first output
        is awaited (with none ready, the first iteration waits for one, as ``generate``).

        A server handler hands its request to the engine at once: a lazy generator sends it
        only when the response starts iterating, and on an event loop busy with a burst
        that waits for the requests queued meanwhile (300 requests at once on the CPU proxy:
        the add left 0.2 s after the handler started at the median, under 3 ms now). Closing
        the iterator aborts the request, as with ``generate``; so does dropping it without
        ever iterating it (a response that never started)."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine is dead: {self._dead!r}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        msg = ("add", request_id, prompt, sampling_params, priority, group_id)
        key = prefix_key(prompt, self._block_size)
        if not self._try_send(stream, request_id, msg, key):
            # No replica ready: the first iteration waits for one.
            return self._outputs(prompt, sampling_params, request_id, priority, group_id,
                                 None)
        outputs = self._outputs(prompt, sampling_params, request_id, priority, group_id,
                                (stream, msg, key))
        stream.unread = abort_if_dropped(outputs, self._abort, request_id, stream)
        return outputs

    async def _outputs(self, prompt: PromptType, sampling_params: SamplingParams,
                       request_id: str, priority: int, group_id: str | None,
                       sent: tuple[_Stream, tuple, int | None] | None
                       ) -> AsyncIterator[RequestOutput]:
        """The request's outputs; ``sent``: its stream, add message and prefix key when
        ``start_request`` sent it."""
        if sent is None:
            if self._dead is not None:
                raise EngineDeadError(f"the engine is dead: {self._dead!r}")
            stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
            msg = ("add", request_id, prompt, sampling_params, priority, group_id)
            key = prefix_key(prompt, self._block_size)
        else:
            stream, msg, key = sent
        finished = False
        try:
            if stream.unread is not None:  # read: this generator's finally aborts from here
                stream.unread.detach()
            delta = sampling_params.output_kind == RequestOutputKind.DELTA
            if sent is None:
                await self._send(stream, request_id, msg, key)
            while True:
                item = await stream.queue.get()
                while isinstance(item, RequestOutput) and not stream.queue.empty():
                    nxt = stream.queue.get_nowait()
                    if not isinstance(nxt, RequestOutput):
                        stream.queue.put_nowait(nxt)
                        break
                    item.add(nxt, aggregate=delta)  # a consumer behind gets it all at once
                if isinstance(item, _Retry):
                    stream.reasons.append(item.reason)
                    if stream.attempts >= MAX_ATTEMPTS:
                        raise RequestFailedError(request_id, (
                            f"the request was lost {stream.attempts} times: "
                            + "; ".join(stream.reasons)))
                    logger.info("request %s: %s; sending it again", request_id, item.reason)
                    await self._send(stream, request_id, msg, key)
                    continue
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._abort(request_id, stream)

    async def _send(self, stream: _Stream, request_id: str, msg: tuple,
                    key: int | None) -> None:
        """Register the stream with a ready replica and send it the request, waiting up to
        ``ready_wait_s`` for a replica when none is ready."""
        deadline = time.monotonic() + self.ready_wait_s
        while True:
            if self._try_send(stream, request_id, msg, key):
                return
            if time.monotonic() > deadline:
                with self._lock:
                    states = {s.index: s.state for s in self.slots}
                raise RequestFailedError(request_id, f"no replica was ready within "
                                         f"{self.ready_wait_s:.0f} s (replicas: {states})")
            await asyncio.sleep(0.05)

    def _try_send(self, stream: _Stream, request_id: str, msg: tuple, key: int | None) -> bool:
        """Register the stream with a ready replica and send it the request; False when no
        replica is ready. Raises EngineDeadError, or ValueError for an id in use."""
        with self._lock:
            if self._dead is not None:
                raise EngineDeadError(f"the engine is dead: {self._dead!r}")
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            loads = {s.index: s.in_flight for s in self.slots if s.state == "ready"}
            index = self._policy.pick(loads, key)
            if index is None:
                return False
            slot = self.slots[index]
            stream.slot, stream.handle = slot, slot.handle
            stream.attempts += 1
            slot.in_flight += 1
            self._streams[request_id] = stream
            handle = slot.handle
        # Outside the lock; a replica dead meanwhile is seen by its reader, which retries or
        # fails this stream (it is registered).
        handle.send(msg)
        return True

    def abort(self, request_id: str) -> None:
        """Abort a request on its replica. Idempotent; safe from any thread."""
        self._abort(request_id, None)

    def _abort(self, request_id: str, only: _Stream | None) -> None:
        """Abort ``request_id`` (only while ``only``'s, when given: a generate() refused
        for a duplicate id must not abort the request that holds it)."""
        with self._lock:
            stream = self._streams.get(request_id)
            if stream is None or (only is not None and stream is not only):
                return
            del self._streams[request_id]
            stream.slot.in_flight -= 1
            handle = stream.handle
        handle.send(("abort", request_id))

    # ------------------------------------------------------------------ replica events
    def _on_batch(self, slot: ReplicaSlot, handle, batch: list) -> None:
        """A batch from a live replica (under the lock): outputs to their streams."""
        deliveries: list[tuple[_Stream, Any]] = []
        for msg in batch:
            kind = msg[0]
            if kind not in ("delta", "out", "more", "fail"):
                continue
            request_id = msg[1]
            stream = self._streams.get(request_id)
            if stream is None or stream.handle is not handle:
                continue  # aborted meanwhile
            if kind == "delta":
                first = stream.first
                if first is None:  # cannot happen: a "delta" follows its request's "out"
                    continue
                deliveries.append((stream, RequestOutput(
                    request_id, first.prompt, first.prompt_token_ids, None,
                    [CompletionOutput(msg[2], msg[3], msg[4], None, None)], False,
                    first.metrics, first.num_cached_tokens)))
                continue
            if kind != "fail":
                out = msg[2]
                if kind == "out":
                    stream.first = out
                elif stream.first is not None:
                    first = stream.first
                    out.prompt, out.prompt_token_ids = first.prompt, first.prompt_token_ids
                    if out.metrics is None:
                        out.metrics = first.metrics
                stream.got_output = True
                if out.finished:
                    del self._streams[request_id]
                    slot.in_flight -= 1
                deliveries.append((stream, out))
            else:
                del self._streams[request_id]
                slot.in_flight -= 1
                deliveries.append((stream, fail_error(request_id, *msg[2:5], slot.index)))
        _deliver_all(deliveries)

    def _on_death(self, slot: ReplicaSlot, handle, why: str) -> None:
        """A replica died (under the lock): retry or fail every request it had."""
        deliveries: list[tuple[_Stream, Any]] = []
        for request_id, stream in list(self._streams.items()):
            if stream.handle is not handle:
                continue
            del self._streams[request_id]
            if stream.got_output:
                deliveries.append((stream, RequestFailedError(request_id, (
                    f"{why}; the request had streamed output already, so it was not "
                    "retried"))))
            else:
                deliveries.append((stream, _Retry(why)))
        slot.in_flight = 0
        _deliver_all(deliveries)

    def _on_all_failed(self, why: str) -> None:
        error = EngineDeadError(why)
        self._fail_everything(error)
        logger.critical("%s", why)
        for fn in list(self.fatal_callbacks):
            try:
                fn(error)
            except Exception:  # noqa: BLE001 - every callback gets its chance
                logger.exception("fatal callback %r failed", fn)

    def _fail_everything(self, error: BaseException) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = error
            dead = EngineDeadError(f"the engine is dead: {error!r}")
            deliveries = [(s, dead) for s in self._streams.values()]
            self._streams.clear()
            for slot in self.slots:
                slot.in_flight = 0
        _deliver_all(deliveries)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every replica: running requests fail with EngineDeadError. Idempotent."""
        self._fail_everything(EngineDeadError("the engine was shut down"))
        self._supervisor.stop_all(timeout)
        at_exit = getattr(self, "_at_exit", None)
        if at_exit is not None:
            atexit.unregister(at_exit)


def check_num_replicas(num_replicas: Any, name: str = "num_replicas") -> None:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {num_replicas!r}")


def _device_groups(num_replicas: int, tp: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each replica process: ``tp`` devices apiece, in order, out of
    the devices this process sees. ValueError when there are too few."""
    import os

    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = ([d.strip() for d in visible.split(",") if d.strip()] if visible
           else [str(i) for i in range(torch.cuda.device_count())])
    if num_replicas * tp > len(ids):
        raise ValueError(f"num_replicas={num_replicas} x tensor_parallel_size={tp} needs "
                         f"{num_replicas * tp} GPUs; {len(ids)} are visible")
    return [",".join(ids[i * tp:(i + 1) * tp]) for i in range(num_replicas)]


def _cpu_share(num_processes: int) -> int | None:
    """Threads per engine process so that together they use this process's cores once;
    None when the user set OMP_NUM_THREADS (theirs to choose)."""
    import os

    if "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return max(1, cores // num_processes)


def _deliver_all(deliveries: list[tuple[_Stream, Any]]) -> None:
    """Hand items to their streams' event loops: one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for stream, item in deliveries:
        by_loop.setdefault(stream.loop, []).append((stream.queue, item))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # that event loop is closed: nobody is listening
            pass


def _deliver(items: list) -> None:
    for queue_, item in items:
        queue_.put_nowait(item)
