"""The boundary between the engine and the workers that run the model.

The engine hands an executor one ``SchedulerOutput`` per step and gets back a future of the
step's ``ModelRunnerOutput``; both are plain, picklable dataclasses (new requests in full,
running ones as diffs), so a step can cross a process boundary as it is. The engine reaches
nothing else of an executor: not its workers, runners or models.

Executors are chosen by ``distributed_executor_backend`` from ``octavo.executor.registry``.
"""

from __future__ import annotations

import pickle
from collections import deque
from typing import Protocol

from octavo.config import EngineConfig
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.errors import InvalidRequestError
from octavo.sampling_params import SamplingParams


class StepFuture(Protocol):
    """A launched step; ``result()`` waits for its sampled tokens. Futures are resolved in
    launch order (a later step's result may be asked for only after an earlier one's)."""

    def result(self) -> ModelRunnerOutput: ...


class QueuedStep:
    """A step sent to workers in other processes, resolved in launch order: ``result()``
    asks the executor to receive results up to this one's (``executor._resolve``), which
    fills ``_out`` or ``_error``. ``refs``: whatever the executor tracks the step by."""

    def __init__(self, executor, refs=None) -> None:
        self._executor = executor
        self._refs = refs
        self._out: ModelRunnerOutput | None = None
        self._error: str | None = None

    def result(self) -> ModelRunnerOutput:
        if self._out is None and self._error is None:
            self._executor._resolve(self)
        if self._error is not None:
            raise RuntimeError(f"the worker failed this step: {self._error}")
        return self._out


class Executor:
    """Loads the model on its worker(s), sizes the KV cache and runs steps."""

    # KV blocks on the device(s) (the minimum over ranks) and in CPU swap space.
    num_blocks: int
    num_cpu_blocks: int
    # Whether steps are pickled to other processes (requests must then pickle too).
    crosses_processes: bool = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    def execute_model_async(self, sched: SchedulerOutput) -> StepFuture | None:
        """Launch one step. Steps are launched in schedule order; the next may be launched
        before the previous one's result() (asynchronous scheduling). With
        ``sched.defer_sampling`` only the forward pass is launched and None returned: the
        step's future comes from ``sample_tokens``, called before the next step is launched.
        """
        raise NotImplementedError

    def sample_tokens(self, grammar) -> StepFuture:
        """Sample the step launched with ``defer_sampling``; ``grammar``: the guided rows'
        token bitmask (an octavo.structured_output.bitmask.GrammarBitmask, plain data) or
        None."""
        raise NotImplementedError

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        future = self.execute_model_async(sched)
        return (future if future is not None else self.sample_tokens(None)).result()

    def reset(self) -> None:
        """Drop every request's worker state (the engine restarts after a fault)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release the workers (processes, devices); idempotent."""


class RemoteExecutor(Executor):
    """Base of the executors whose workers run in other processes (``mp``, ``ray``): each
    sampled step is a QueuedStep, answered by rank 0 in launch order."""

    crosses_processes = True

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._pending: deque[QueuedStep] = deque()

    def _next_answer(self, head: QueuedStep) -> tuple[str, object]:
        """Rank 0's answer to ``head``, the oldest step in flight: ("out",
        ModelRunnerOutput) or ("error", text)."""
        raise NotImplementedError

    def _track(self, refs=None) -> QueuedStep:
        future = QueuedStep(self, refs)
        self._pending.append(future)
        return future

    def _resolve(self, future: QueuedStep) -> None:
        """Take answers in launch order up to ``future``'s."""
        while future._out is None and future._error is None:
            head = self._pending.popleft()
            kind, payload = self._next_answer(head)
            if kind == "out":
                head._out = payload
            else:
                head._error = payload

    def _drain(self) -> None:
        """Wait out the steps still in flight (their results are dropped): before a reset."""
        if self._pending:
            self._resolve(self._pending[-1])


def check_picklable(params: SamplingParams) -> None:
    """Refuse, before it is queued, a request whose per-request code (logits processors)
    cannot travel to a worker process; anything else in SamplingParams is plain data."""
    for i, proc in enumerate(params.logits_processors or ()):
        try:
            pickle.dumps(proc)
        except Exception as e:
            raise InvalidRequestError(
                "logits_processors", f"logits_processors[{i}] ({proc!r}) cannot be pickled "
                f"to the worker process ({type(e).__name__}: {e}); with "
                "distributed_executor_backend='mp' use a module-level function or class"
            ) from None
