"""AsyncLLM: an LLMEngine stepped by a background thread, with one async output stream per
request.

Only the engine thread touches the engine. Everything else reaches it through a command queue
(`run_in_engine`), drained before every step, so adds and aborts never wait on a lock held by a
long step and never race the scheduler. Outputs travel back to each request's own event loop
with `call_soon_threadsafe`, so servers on several loops may share one AsyncLLM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.beam_runner import BeamSearchRunner, request_output
from octavo.engine.llm_engine import LLMEngine, StepStats
from octavo.engine.processor import PromptType
from octavo.errors import RequestFailedError
from octavo.outputs import RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine loop stopped (a fault it could not recover from, or shutdown); no request
    can run."""


# A step fault that no request explains restarts the engine (every in-flight request fails,
# then a health check). More than this many restarts within the window means the fault is
# not transient: the engine dies and the fatal callbacks (the server's exit) run.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


@dataclass
class FinishedRequestStats:
    finish_reason: str
    e2e_seconds: float
    ttft_seconds: float | None
    num_output_tokens: int = 0
    queue_seconds: float | None = None


class StatLogger(Protocol):
    """Receives engine statistics on the engine thread after every step."""

    def record(self, stats: StepStats, num_new_preemptions: int,
               finished: list[FinishedRequestStats]) -> None: ...


# Receives, on the engine thread, once per step, a list of (request_id, RequestOutput or the
# exception that ended the request) for the requests added with ``add_request_to_sink``;
# with ``plain_deltas``, a request's unfinished outputs after its first are StepDelta tuples
# (request_id, completion index, new text, new token ids) instead of RequestOutputs.
Sink = Callable[[list], None]


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop | None
    queue: asyncio.Queue | None
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    delta: bool = False
    tokens: dict = field(default_factory=dict)  # completion index -> tokens so far
    request_id: str = ""
    sink: Sink | None = None  # instead of loop and queue
    # start_request's abort of an iterator dropped unread; detached once it is read.
    unread: weakref.finalize | None = None


class AsyncLLM:
    def __init__(self, engine: LLMEngine, stat_loggers: list[StatLogger] | None = None) -> None:
        self.engine = engine
        self.stat_loggers: list[StatLogger] = list(stat_loggers or [])
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        # use_beam_search requests: rounds of one-token requests (beam_runner.py) that the
        # engine thread submits as each round ends; engine thread only.
        self._beams = BeamSearchRunner(engine)
        self._dead: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._preemptions_seen = engine.scheduler.num_preemptions
        # Called (on the engine thread) when the engine dies of a fault, not of shutdown():
        # a server registers its exit here, so a dead engine never outlives as a live
        # process that answers 503 forever.
        self.fatal_callbacks: list[Callable[[BaseException], None]] = []
        self._restarts: list[float] = []
        self.num_restarts = 0
        self._pending: dict | None = None  # per-loop deliveries while _dispatch runs

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> AsyncLLM:
        return cls(LLMEngine.from_engine_args(args))

    # ------------------------------------------------------------------ state
    @property
    def errored(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> BaseException | None:
        return self._dead

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.errored

    def get_tokenizer(self):
        return self.engine.get_tokenizer()

    @property
    def model_config(self):
        return self.engine.config.model_config

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine is dead: {self._dead!r}")

    def _ensure_started(self) -> None:
        self._check_alive()
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="octavo-engine",
                                                daemon=True)
                self._thread.start()

    # ------------------------------------------------------------------ commands
    def _submit(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        self._ensure_started()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((fn, fut))
        self._wake.set()
        if self._dead is not None:  # died between the check and the put
            self._fail_commands()
        return fut

    async def run_in_engine(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps; its result or exception."""
        return await asyncio.wrap_future(self._submit(fn))

    def abort(self, request_id: str) -> None:
        """Abort a request: its KV blocks are freed before the next engine step. Idempotent;
        safe from any thread, and a no-op once the engine is dead."""
        if self._dead is not None or self._thread is None:
            return
        self._submit(lambda engine: self._abort_now(request_id))

    def _abort_now(self, request_id: str) -> None:
        if self._beams.has_job(request_id):
            self._streams.pop(request_id, None)
            self._beams.abort_job(request_id)
        elif self._streams.pop(request_id, None) is not None or \
                request_id in self.engine.states:
            self.engine.abort_request(request_id)

    # ------------------------------------------------------------------ requests
    def generate(self, prompt: PromptType, sampling_params: SamplingParams,
                 request_id: str, priority: int = 0,
                 group_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream the outputs of one request (DELTA or CUMULATIVE per ``output_kind``).

        Invalid prompts or parameters raise ValueError before anything is yielded. If the
        consumer stops iterating early (closes the generator, or is cancelled), the request is
        aborted and its KV blocks return to the pool.

        ``use_beam_search=True`` runs a beam search (width ``best_of or n``) on the engine
        thread, as rounds of one-token requests interleaved with everyone else's; its one
        output is the final RequestOutput with the ``n`` best beams, best first, whatever
        the ``output_kind``.
        """
        return self._outputs(prompt, sampling_params, request_id, priority, group_id, None)

    def start_request(self, prompt: PromptType, sampling_params: SamplingParams,
                      request_id: str, priority: int = 0,
                      group_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """``generate`` with the request queued for the engine thread now, not at the first
        iteration (``ReplicaRouter.start_request`` says why servers want that). Closing the
        iterator aborts the request, as with ``generate``; so does dropping it without ever
        iterating it. Errors of the add (ValueError) come at the first iteration."""
        started = self._queue_add(prompt, sampling_params, request_id, priority, group_id)
        outputs = self._outputs(prompt, sampling_params, request_id, priority, group_id,
                                started)
        stream = started[0]
        stream.unread = abort_if_dropped(outputs, self._abort_stream, request_id, stream)
        return outputs

    def _queue_add(self, prompt: PromptType, sampling_params: SamplingParams,
                   request_id: str, priority: int, group_id: str | None
                   ) -> tuple[_Stream, concurrent.futures.Future]:
        """A new stream for the request, and its add queued for the engine thread."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(),
                         delta=sampling_params.output_kind == RequestOutputKind.DELTA)
        return stream, self._submit(self._adder(stream, request_id, prompt, sampling_params,
                                                priority, group_id))

    async def _outputs(self, prompt: PromptType, sampling_params: SamplingParams,
                       request_id: str, priority: int, group_id: str | None,
                       started: tuple[_Stream, concurrent.futures.Future] | None
                       ) -> AsyncIterator[RequestOutput]:
        """The request's outputs; ``started``: its stream and add when ``start_request``
        queued it already."""
        if started is None:
            started = self._queue_add(prompt, sampling_params, request_id, priority,
                                      group_id)
        stream, added = started
        if stream.unread is not None:  # read: this generator aborts from here
            stream.unread.detach()
        delta = stream.delta
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            self.abort(request_id)  # queued after the add: it cannot be orphaned
            raise
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                # A consumer that fell behind gets everything so far in one output.
                while not isinstance(item, BaseException) and not stream.queue.empty():
                    nxt = stream.queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        stream.queue.put_nowait(nxt)
                        break
                    item.add(nxt, aggregate=delta)
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def _abort_stream(self, request_id: str, stream: _Stream) -> None:
        """Abort ``request_id`` while ``stream`` is its stream (an add refused for an id in
        use must not abort the request holding it; a finished one is gone already)."""
        if self._dead is not None or self._thread is None:
            return
        self._submit(lambda engine: self._streams.get(request_id) is stream
                     and self._abort_now(request_id))

    def add_request_to_sink(self, request_id: str, prompt: PromptType,
                            sampling_params: SamplingParams, sink: Sink, priority: int = 0,
                            group_id: str | None = None,
                            plain_deltas: bool = False) -> concurrent.futures.Future:
        """Queue a request whose outputs go to ``sink`` (see ``Sink``) instead of an async
        stream: an engine process hands a whole step's outputs to its transport in one call,
        with no task or queue per request. The future fails as ``generate`` would raise
        before its first output (ValueError for an invalid request); ``abort`` ends the
        request without a further output. ``plain_deltas``: see ``LLMEngine.add_request``
        (a DELTA request's common step output as plain values, built in one pass from the
        request's state)."""
        stream = _Stream(None, None, request_id=request_id, sink=sink,
                         delta=sampling_params.output_kind == RequestOutputKind.DELTA)
        return self._submit(self._adder(stream, request_id, prompt, sampling_params, priority,
                                        group_id, plain_deltas))

    def _adder(self, stream: _Stream, request_id: str, prompt: PromptType,
               sampling_params: SamplingParams, priority: int,
               group_id: str | None, plain_deltas: bool = False
               ) -> Callable[[LLMEngine], None]:
        """The engine-thread command that adds a request and registers its stream."""
        def add(engine: LLMEngine) -> None:
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            if sampling_params.use_beam_search:
                job = self._beams.job_for_sampling(request_id, prompt, sampling_params,
                                                   priority)
                self._beams.start(job)
            else:
                engine.add_request(request_id, prompt, sampling_params, priority=priority,
                                   group_id=group_id, plain_deltas=plain_deltas)
            self._streams[request_id] = stream

        return add

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._wake.clear()
                self._drain_commands()
                if self._stopping:
                    break
                if not engine.has_unfinished_requests():
                    self._wake.wait()
                    continue
                try:
                    outputs = engine.step()
                except Exception as e:  # noqa: BLE001 - unattributable: restart
                    self._restart(e)
                    continue
                self._dispatch(outputs)
        except BaseException as e:  # noqa: BLE001 - a dead engine must fail every waiter
            logger.exception("engine loop died")
            self._die(e)
            self._run_fatal_callbacks(e)
            return
        ids = list(engine.states)
        self._beams.forget()  # their rounds are among ids
        if ids:  # shutdown: nothing may keep KV blocks
            engine.abort_request(ids)
        self._die(EngineDeadError("the engine was shut down"))

    def _restart(self, error: BaseException) -> None:
        """A step failed and no single request explains it: the engine has dropped every
        request; fail their streams, then check the device still serves. Raises (killing
        the loop) when the check fails or faults repeat."""
        self.num_restarts += 1
        failure = RequestFailedError(
            "", f"the engine restarted after an internal error ({error}); this request was "
            "lost, retry it")
        for stream in self._streams.values():
            self._put(stream, failure)
        self._streams.clear()
        self._beams.forget()  # the engine dropped their rounds
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self._restarts) > MAX_RESTARTS:
            raise RuntimeError(f"{len(self._restarts)} engine restarts within "
                               f"{RESTART_WINDOW_S:.0f} s; last: {error}") from error
        logger.warning("engine restarted after a step fault (%s); checking health", error)
        self.engine.check_health()
        self._preemptions_seen = self.engine.scheduler.num_preemptions

    def _run_fatal_callbacks(self, error: BaseException) -> None:
        for fn in list(self.fatal_callbacks):
            try:
                fn(error)
            except Exception:  # noqa: BLE001 - every callback gets its chance
                logger.exception("fatal callback %r failed", fn)

    def _drain_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(self.engine))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _dispatch(self, outputs: list) -> None:
        # One wake-up per event loop per step, not one per stream: with hundreds of streams
        # on one loop, a call_soon_threadsafe each (a pipe write, a loop iteration, GIL
        # hand-offs with this thread) cost more than the step itself.
        t0 = time.perf_counter()
        self._pending = {}
        try:
            self._dispatch_outputs(outputs)
        finally:
            self._flush_pending()
            self.engine.timings.dispatch_s += time.perf_counter() - t0

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, None
        for target, items in pending.items():
            if not isinstance(target, asyncio.AbstractEventLoop):
                _to_sink(target, items)
                continue
            try:
                target.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass

    def _dispatch_outputs(self, outputs: list) -> None:
        now = time.monotonic()
        finished: list[FinishedRequestStats] = []
        streams = self._streams
        for out in outputs:
            if out.__class__ is tuple:  # a StepDelta: a sink's request (plain_deltas)
                request_id, index, _, token_ids = out
                stream = streams.get(request_id)
                if stream is None:
                    continue
                tokens = stream.tokens
                tokens[index] = tokens.get(index, 0) + len(token_ids)
                if stream.first_token is None and token_ids:
                    stream.first_token = now
                self._put(stream, out)
                continue
            if self._beams.owns(out.request_id):
                self._beam_round(out, now, finished)
                continue
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if stream.first_token is None and any(c.token_ids for c in out.outputs):
                stream.first_token = now
            for c in out.outputs:
                n = len(c.token_ids)
                stream.tokens[c.index] = stream.tokens.get(c.index, 0) + n if stream.delta else n
            if out.error is not None:  # a fault of this request's own: it alone fails
                del self._streams[out.request_id]
                finished.append(FinishedRequestStats("error", now - stream.arrival, None))
                self._put(stream, RequestFailedError(out.request_id, out.error,
                                                     out.error_param))
                continue
            if out.finished:
                del self._streams[out.request_id]
                comp = out.outputs[0]
                times = out.metrics
                # Engine-side stamp of the first token when there is one: a non-streamed
                # request sees its only output at the end.
                first = getattr(times, "first_token_time", None) or stream.first_token
                first = None if first is None else max(first, stream.arrival)
                finished.append(FinishedRequestStats(
                    finish_reason=comp.finish_reason or "stop",
                    e2e_seconds=now - stream.arrival,
                    ttft_seconds=None if first is None else first - stream.arrival,
                    num_output_tokens=max(stream.tokens.values(), default=0),
                    queue_seconds=getattr(times, "queue_seconds", None)))
            self._put(stream, out)
        stats = self.engine.last_stats
        preempt = self.engine.scheduler.num_preemptions
        new_preempt, self._preemptions_seen = preempt - self._preemptions_seen, preempt
        for sl in self.stat_loggers:
            try:
                sl.record(stats, new_preempt, finished)
            except Exception:  # a metrics bug must not kill serving
                logger.exception("stat logger %r failed", sl)

    def _beam_round(self, out: RequestOutput, now: float,
                    finished: list[FinishedRequestStats]) -> None:
        """One round request of a beam search answered: the search advances (its next round
        is queued) or ends, and then its stream gets the final output."""
        job_id = self._beams.job_of(out.request_id).request_id
        try:
            if out.error is not None:
                raise RequestFailedError(job_id, out.error, out.error_param)
            job = self._beams.consume(out)
            if job is None:
                return
            result = request_output(job, self.engine.get_tokenizer())
        except Exception as e:  # noqa: BLE001 - this search alone fails
            self._beams.abort_job(job_id)
            stream = self._streams.pop(job_id, None)
            if stream is not None:
                finished.append(FinishedRequestStats("error", now - stream.arrival, None))
                self._put(stream, e if isinstance(e, RequestFailedError)
                          else RequestFailedError(job_id, f"beam search failed: {e}"))
            return
        stream = self._streams.pop(job_id, None)
        if stream is None:  # aborted meanwhile
            return
        # The client sees no token before the end: no time to first token to report.
        finished.append(FinishedRequestStats(
            finish_reason=result.outputs[0].finish_reason or "stop",
            e2e_seconds=now - stream.arrival, ttft_seconds=None,
            num_output_tokens=max((len(c.token_ids) for c in result.outputs), default=0)))
        self._put(stream, result)

    def _put(self, stream: _Stream, item: Any) -> None:
        pending = self._pending
        if stream.sink is not None:
            if pending is not None:  # inside _dispatch: one call per sink per step
                pending.setdefault(stream.sink, []).append((stream.request_id, item))
            else:
                _to_sink(stream.sink, [(stream.request_id, item)])
            return
        if pending is not None:  # inside _dispatch: delivered in one batch per loop
            pending.setdefault(stream.loop, []).append((stream.queue, item))
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # that event loop is closed: nobody is listening
            pass

    def _die(self, error: BaseException) -> None:
        if self._dead is None:
            self._dead = error
        dead = EngineDeadError(f"the engine is dead: {error!r}")
        for stream in self._streams.values():
            self._put(stream, dead)
        self._streams.clear()
        self._fail_commands()

    def _fail_commands(self) -> None:
        while True:
            try:
                _, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineDeadError(f"the engine is dead: {self._dead!r}"))

    def mark_dead(self, error: BaseException) -> None:
        """Declare the engine dead (an external health check failed); later requests see it
        and the fatal callbacks run."""
        self._dead = error
        self._stopping = True
        self._wake.set()
        if self._thread is None:
            self._die(error)
        self._run_fatal_callbacks(error)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine loop: running requests are aborted and their streams fail."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self.engine.shutdown()  # worker processes, under the "mp" executor


def _to_sink(sink: Sink, items: list) -> None:
    try:
        sink(items)
    except Exception:  # noqa: BLE001 - a transport bug must not kill the engine loop
        logger.exception("output sink %r failed", sink)


def _deliver(items: list) -> None:
    """On the event loop: hand a step's outputs to their streams' queues."""
    for queue_, item in items:
        queue_.put_nowait(item)


def abort_if_dropped(outputs: AsyncIterator, abort: Callable[[str, Any], None],
                     request_id: str, stream: Any) -> weakref.finalize:
    """A finalizer calling ``abort(request_id, stream)`` on ``stream.loop``'s thread once
    ``outputs`` (a started request's output iterator) is collected; ``abort`` acts only while
    the request is still that stream's. The iterator detaches it once it is read (its own
    finally aborts from then on). Shared by ``AsyncLLM`` and ``ReplicaRouter.start_request``."""
    return weakref.finalize(outputs, _call_on_loop, stream.loop, abort, request_id, stream)


def _call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    # A finalizer may run on any thread, inside any lock: the call goes to the loop's thread.
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # that event loop is closed: nobody is left to serve
        pass
