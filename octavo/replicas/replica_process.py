"""A replica as a plain process (``multiprocessing`` spawn), under the ``uni`` and ``mp``
backends: the child runs a ``ReplicaCore``; one pipe carries the router's messages in and the
replica's batches out.

In the child, the main thread reads messages (EOF: the router's process is gone, so the
replica ends too), the engine thread sends each step's outputs, and a sender thread sends
the rest of the outbox (ready, refusals, the stats heartbeat), all through a ``PipeWriter``
(a full pipe never blocks the engine thread). In the router, a reader
thread receives batches and reports the pipe's end (the child died, or was stopped) once.
The child is a daemon unless it is tensor-parallel (it then starts worker processes of its
own, which a daemon may not); the router stops its replicas at exit either way.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable

from octavo.replicas.messages import ReplicaSpec
from octavo.replicas.pipe_writer import PipeWriter

logger = logging.getLogger(__name__)


def replica_process_main(conn, spec: ReplicaSpec) -> None:
    if spec.cuda_visible_devices is not None:  # before anything initializes CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    if spec.cpu_threads is not None:  # before torch starts its thread pool
        os.environ["OMP_NUM_THREADS"] = str(spec.cpu_threads)
    logging.basicConfig(level=spec.log_level,
                        format=f"%(levelname)s replica {spec.index} %(name)s: %(message)s")
    # Ctrl-C in a terminal reaches the whole process group: the router stops replicas itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from octavo.executor.worker_rank import error_text
    from octavo.replicas.replica_core import ReplicaCore

    try:
        core = ReplicaCore(spec, on_fatal=lambda e: os._exit(1))
    except BaseException as e:  # noqa: BLE001 - the router raises with this text
        conn.send([("start_error", error_text(e))])
        return
    stop = threading.Event()
    from octavo import envs

    # In order, from any thread; a full pipe (the router's process behind) queues the batch
    # for the writer's own thread rather than blocking the engine's. The router gone: exit.
    writer = core.pipe_writer = PipeWriter(conn, on_closed=lambda: os._exit(0))
    send = writer.send

    if envs.replica_direct_send():
        # The engine thread sends each step's outputs itself: handing them to the sender
        # thread cost a GIL hand-off every step.
        core.direct_send = send

    def send_loop() -> None:
        while not stop.is_set():
            batch = core.take()
            if batch:
                send(batch)

    threading.Thread(target=send_loop, name="octavo-replica-send", daemon=True).start()
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "shutdown":
                break
            core.handle(msg)
    finally:
        stop.set()
        core.shutdown()


class ProcessReplica:
    """The router's handle on one replica process."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.pid: int | None = None
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # Requests and aborts go out from the server's event loop: a full pipe (the engine
        # process reading between its steps, a burst of adds) queues them for the writer's
        # thread instead of blocking the loop, and with it every HTTP client. A dead
        # replica's pipe refuses quietly: its reader reports the death.
        self._writer = PipeWriter(self._conn, on_closed=lambda: None)
        # A daemon ends with this process; one with TP workers of its own cannot be one.
        daemon = spec.engine_args.tensor_parallel_size == 1
        self._proc = ctx.Process(target=replica_process_main, args=(child, spec),
                                 name=f"octavo-replica-{spec.index}", daemon=daemon)
        self._child = child
        # stop() and start() may race (a supervisor restarting a slot while the router shuts
        # down): a handle stopped before it started never starts.
        self._life = threading.Lock()
        self._stopped = False

    def start(self, on_batch: Callable[[list], None], on_exit: Callable[[str], None]) -> None:
        """Start the process; ``on_batch`` gets every batch, then ``on_exit`` (why it ended)
        once, both on a reader thread; nothing when the handle was stopped already."""
        with self._life:
            if self._stopped:
                return
            self._proc.start()
            self._child.close()  # EOF reaches the reader only if no copy of the child's end
            self.pid = self._proc.pid  # lives

        def read() -> None:
            while True:
                try:
                    batch = self._conn.recv()
                except (EOFError, OSError):
                    break
                try:
                    on_batch(batch)
                except Exception:  # noqa: BLE001 - a router bug must not stop the reader
                    logger.exception("replica %d: a batch could not be handled",
                                     self.spec.index)
            self._proc.join(5)
            code = self._proc.exitcode
            why = (f"killed by signal {-code}" if code is not None and code < 0
                   else f"exit code {code}")
            on_exit(f"its process (pid {self.pid}) ended: {why}")

        threading.Thread(target=read, name=f"octavo-replica-{self.spec.index}-reader",
                         daemon=True).start()

    def send(self, msg: tuple) -> None:
        """Best effort, in order, from any thread, never blocking on a full pipe: a dead
        replica's pipe refuses, and its reader reports the death."""
        self._writer.send(msg)

    def kill(self) -> None:
        if self._proc.pid is not None and self._proc.is_alive():
            self._proc.kill()

    def stop(self, timeout: float = 10.0) -> None:
        with self._life:  # a start in progress finishes first; a later one is refused
            self._stopped = True
            started = self._proc.pid is not None
        self.send(("shutdown",))
        if not started:
            self._writer.close()
            self._child.close()  # a write still blocked on the pipe fails and ends
            return
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._writer.close()
