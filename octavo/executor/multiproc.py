"""Executor with its workers in separate processes (``distributed_executor_backend="mp"``),
one per tensor-parallel rank.

Each step's ``SchedulerOutput`` is pickled through a pipe to every rank, and rank 0 sends back
the ``ModelRunnerOutput``; the engine's process keeps only the scheduler, tokenizer and
outputs, so the model's host work no longer shares a GIL with the API server or the engine.
A worker launches a step as soon as it arrives, even while the previous one still runs on the
device, so asynchronous scheduling overlaps as it does in process (``worker_proc``).

Sampling runs on every rank, identically: the LM head is replicated and its input is the
same on every rank after the all-reduce (the collectives give every rank the same sums), and
each rank's generators start from the same seed. So every rank appends the same token to its
own copy of each request without a broadcast per step; rank 0's tokens are the ones returned.

The worker is started with ``spawn`` (CUDA cannot be forked): a script that builds an engine
with this backend needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing as mp

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.executor.base import QueuedStep, RemoteExecutor
from octavo.executor.worker_proc import worker_main


class WorkerDiedError(RuntimeError):
    pass


class MultiprocExecutor(RemoteExecutor):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        ctx = mp.get_context("spawn")
        tp = config.parallel_config.tensor_parallel_size
        port = _free_port() if tp > 1 else 0
        self._conns, self._procs = [], []
        for rank in range(tp):
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(child, config, rank, port),
                               daemon=True, name=f"octavo-worker-{rank}")
            proc.start()
            child.close()
            self._conns.append(conn)
            self._procs.append(proc)
        try:
            sizes = [self._expect(r, "sized") for r in range(tp)]
            # The pool is what every rank can hold.
            self.num_blocks = min(s[0] for s in sizes)
            self.num_cpu_blocks = min(s[1] for s in sizes)
            for r in range(tp):
                self._send(("init", (self.num_blocks, self.num_cpu_blocks)), r)
            for r in range(tp):
                self._expect(r, "ready")
        except BaseException:
            self.shutdown()
            raise

    def _expect(self, rank: int, kind: str):
        got, payload = self._recv(rank)
        if got != kind:
            raise RuntimeError(f"worker process {rank} could not start: {payload}")
        return payload

    # ------------------------------------------------------------------ transport
    def _recv(self, rank: int):
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            raise self._died(rank) from None

    def _send(self, msg, rank: int | None = None) -> None:
        for r in (range(len(self._conns)) if rank is None else (rank,)):
            try:
                self._conns[r].send(msg)
            except (BrokenPipeError, OSError):
                raise self._died(r) from None

    def _died(self, rank: int) -> WorkerDiedError:
        proc = self._procs[rank]
        proc.join(1)
        return WorkerDiedError(f"the worker process of rank {rank} died (exit code "
                               f"{proc.exitcode})")

    def _next_answer(self, head: QueuedStep) -> tuple[str, object]:
        return self._recv(0)  # rank 0 answers steps, in the order they were sent

    # ------------------------------------------------------------------ Executor
    def execute_model_async(self, sched: SchedulerOutput) -> QueuedStep | None:
        self._send(("step", sched))
        if sched.defer_sampling:
            return None  # its result comes after ("sample", bitmask)
        return self._track()

    def sample_tokens(self, grammar) -> QueuedStep:
        self._send(("sample", grammar))
        return self._track()

    def reset(self) -> None:
        self._drain()  # results of abandoned steps still come, in order
        self._send(("reset", None))
        for r in range(len(self._conns)):
            kind, payload = self._recv(r)
            if kind != "ok":
                raise RuntimeError(f"worker process {r} could not reset: {payload}")

    def shutdown(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    conn.send(("shutdown", None))
                except (BrokenPipeError, OSError):
                    pass
        for conn, proc in zip(self._conns, self._procs):
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            conn.close()

    def __del__(self) -> None:
        for proc in getattr(self, "_procs", ()):
            if proc.is_alive():
                proc.terminate()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
