"""PipeWriter: a sending end of the pipe between the router and a replica process, in order,
without blocking the sender while the pipe has room. Both ends use one: the replica's engine
thread sends step outputs, the server's event loop sends requests and aborts (a burst of adds
fills the pipe while the engine process reads between steps; a blocking send there stalled
every HTTP client of the server).

The engine thread sends each step's outputs itself (handing them to another thread cost a
GIL hand-off every step, and pickling holds the GIL wherever it runs). But a plain
``Connection.send`` blocks once the pipe is full, that is whenever the router's process
(busy serving HTTP) falls behind reading: the engine's next step then waits on the server.
Here a batch is pickled by the caller and written at once only when nothing is queued
before it and the pipe is writable (a Unix socket is writable with a good part of its
buffer free; batches larger than ``max_direct`` are queued anyway); otherwise it is queued
for the writer thread, which blocks on the pipe instead, with the GIL released. Batches
reach the router in the order they were sent, whichever thread wrote them.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler

# A batch written by the caller must fit in what a writable pipe surely has free.
MAX_DIRECT_BYTES = 32 * 1024


class PipeWriter:
    def __init__(self, conn, on_closed: Callable[[], None] = lambda: os._exit(0),
                 max_direct: int = MAX_DIRECT_BYTES) -> None:
        """``conn``: a ``multiprocessing`` Connection; ``on_closed``: called when the pipe
        is gone (the router's process ended), on whichever thread found out."""
        self._conn = conn
        self._on_closed = on_closed
        self._max_direct = max_direct
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: list[bytes] = []
        self._busy = False  # the writer thread is writing queued batches
        self._closed = False
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLOUT)
        self.num_sent = 0
        self.num_queued = 0  # of them, through the writer thread: the pipe was full
        self._thread = threading.Thread(target=self._write_loop, name="octavo-replica-write",
                                        daemon=True)
        self._thread.start()

    def send(self, batch: list) -> None:
        """Send one batch (any thread); blocks only while another thread writes."""
        data = ForkingPickler.dumps(batch)
        with self._lock:
            if self._closed:
                return
            self.num_sent += 1
            if (not self._queue and not self._busy and len(data) <= self._max_direct
                    and self._writable()):
                try:
                    self._conn.send_bytes(data)
                except OSError:  # BrokenPipeError included: the router is gone
                    self._closed = True
                else:
                    return
            else:
                self._queue.append(data)
                self.num_queued += 1
                self._cond.notify()
                return
        self._on_closed()

    def close(self) -> None:
        """Stop: what is still queued is dropped, and the writer thread ends."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._cond.notify()

    def _writable(self) -> bool:
        return any(ev & select.POLLOUT for _, ev in self._poll.poll(0))

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._busy = False
                    self._cond.wait()
                if self._closed:
                    return
                batches, self._queue = self._queue, []
                self._busy = True
            try:
                for data in batches:
                    self._conn.send_bytes(data)
            except OSError:
                with self._lock:
                    self._closed = True
                    self._queue.clear()
                self._on_closed()
                return
