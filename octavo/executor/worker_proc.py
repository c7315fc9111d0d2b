"""The loop of a worker process (``MultiprocExecutor``): messages in, results out, in order.

Messages: ("step", SchedulerOutput), ("reset", None), ("shutdown", None). Replies: ("ready",
(num_blocks, num_cpu_blocks)) once set up, then per step ("out", ModelRunnerOutput) or
("error", text), and ("ok", None) per reset.

A step is launched as soon as it arrives; while steps are in flight the loop takes the next
message if one is waiting (so the engine's next step is launched before this one's tokens are
back, as asynchronous scheduling wants), else sends the oldest step's result once the device
has it.
"""

from __future__ import annotations

import traceback
from collections import deque

POLL_S = 0.0002  # while the device runs a step: how long to wait for a message per round


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def worker_main(conn, config) -> None:
    from octavo.worker.worker import Worker

    try:
        worker = Worker(config)
        conn.send(("ready", worker.setup()))
    except BaseException as e:  # the parent raises with this text
        conn.send(("error", _error_text(e) + "\n" + traceback.format_exc()))
        return
    pending: deque = deque()  # StepHandle, or the error text of a step that failed to launch

    def send_oldest() -> None:
        item = pending.popleft()
        if isinstance(item, str):
            conn.send(("error", item))
            return
        try:
            conn.send(("out", item.result()))
        except Exception as e:
            conn.send(("error", _error_text(e)))

    while True:
        if pending:
            head = pending[0]
            ready = isinstance(head, str) or head.is_ready()
            if not conn.poll(0 if ready else POLL_S):
                if ready:
                    send_oldest()
                continue
        try:
            kind, payload = conn.recv()
        except EOFError:  # the engine's process is gone
            return
        if kind == "step":
            try:
                pending.append(worker.execute_model_async(payload))
            except Exception as e:
                pending.append(_error_text(e))
        elif kind == "reset":
            while pending:
                send_oldest()
            try:
                worker.reset()
                conn.send(("ok", None))
            except Exception as e:
                conn.send(("error", _error_text(e)))
        elif kind == "shutdown":
            while pending:
                send_oldest()
            return
