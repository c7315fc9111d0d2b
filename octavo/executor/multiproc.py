"""Executor with its worker in a separate process (``distributed_executor_backend="mp"``).

Each step's ``SchedulerOutput`` is pickled through a pipe to the worker process, which sends
back the ``ModelRunnerOutput``; the engine's process keeps only the scheduler, tokenizer and
outputs, so the model's host work no longer shares a GIL with the API server or the engine.
The worker launches a step as soon as it arrives, even while the previous one still runs on the
device, so asynchronous scheduling overlaps as it does in process (``worker_proc``).

The worker is started with ``spawn`` (CUDA cannot be forked): a script that builds an engine
with this backend needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import deque

from octavo.config import EngineConfig
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.executor.base import Executor
from octavo.executor.worker_proc import worker_main


class WorkerDiedError(RuntimeError):
    pass


class _Future:
    def __init__(self, executor: MultiprocExecutor) -> None:
        self._executor = executor
        self._out: ModelRunnerOutput | None = None
        self._error: str | None = None

    def result(self) -> ModelRunnerOutput:
        if self._out is None and self._error is None:
            self._executor._resolve(self)
        if self._error is not None:
            raise RuntimeError(f"the worker process failed this step: {self._error}")
        return self._out


class MultiprocExecutor(Executor):
    crosses_processes = True

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=worker_main, args=(child, config), daemon=True,
                                 name="octavo-worker-0")
        self._proc.start()
        child.close()
        self._pending: deque[_Future] = deque()
        kind, payload = self._recv()
        if kind != "ready":
            self.shutdown()
            raise RuntimeError(f"the worker process could not start: {payload}")
        self.num_blocks, self.num_cpu_blocks = payload

    # ------------------------------------------------------------------ transport
    def _recv(self):
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(1)
            raise WorkerDiedError(f"the worker process died (exit code {self._proc.exitcode})"
                                  ) from None

    def _send(self, msg) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError):
            self._proc.join(1)
            raise WorkerDiedError(f"the worker process died (exit code {self._proc.exitcode})"
                                  ) from None

    def _resolve(self, future: _Future) -> None:
        """Receive step results in launch order up to ``future``'s."""
        while future._out is None and future._error is None:
            head = self._pending.popleft()
            kind, payload = self._recv()
            if kind == "out":
                head._out = payload
            else:
                head._error = payload

    # ------------------------------------------------------------------ Executor
    def execute_model_async(self, sched: SchedulerOutput) -> _Future:
        self._send(("step", sched))
        future = _Future(self)
        self._pending.append(future)
        return future

    def reset(self) -> None:
        if self._pending:  # results of abandoned steps still come, in order
            self._resolve(self._pending[-1])
        self._send(("reset", None))
        kind, payload = self._recv()
        if kind != "ok":
            raise RuntimeError(f"the worker process could not reset: {payload}")

    def shutdown(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("shutdown", None))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.is_alive():
            proc.terminate()
