"""The loop of a worker process (``MultiprocExecutor``): messages in, results out, in order.

Setup: the worker joins its tensor-parallel group, loads its shard of the model and replies
("sized", (num_blocks, num_cpu_blocks)); the executor answers ("init", the minimum over
ranks), the worker allocates its KV cache and replies ("ready", None).
Then messages: ("step", SchedulerOutput), ("sample", bitmask) after a step launched with
``defer_sampling``, ("reset", None), ("shutdown", None). Replies: per sampled step ("out",
ModelRunnerOutput) or ("error", text) from rank 0 only (every rank computes the same tokens:
see ``MultiprocExecutor``), and ("ok", None) per reset from every rank.

A step is launched as soon as it arrives; while steps are in flight the loop takes the next
message if one is waiting (so the engine's next step is launched before this one's tokens are
back, as asynchronous scheduling wants), else sends the oldest step's result once the device
has it.
"""

from __future__ import annotations

from collections import deque

from octavo.executor.worker_rank import WorkerRank, error_text

POLL_S = 0.0002  # while the device runs a step: how long to wait for a message per round


def worker_main(conn, config, rank: int = 0, port: int = 0) -> None:
    worker = WorkerRank(config, rank, port)
    try:
        conn.send(("sized", worker.load_and_size()))
        kind, sizes = conn.recv()
        if kind != "init":
            return
        worker.init_kv_cache(*sizes)
        conn.send(("ready", None))
    except BaseException as e:  # the parent raises with this text
        conn.send(("error", error_text(e, with_traceback=True)))
        return
    pending: deque = deque()  # launched steps not yet answered (WorkerRank.launch)

    def send_oldest() -> None:
        reply = worker.answer(pending.popleft())
        if reply is not None:
            conn.send(reply)

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
            item = worker.launch(payload)
            if item is not None:  # else it comes with ("sample", bitmask)
                pending.append(item)
        elif kind == "sample":
            pending.append(worker.sample(payload))
        elif kind == "reset":
            while pending:
                send_oldest()
            try:
                worker.reset()
                conn.send(("ok", None))
            except Exception as e:
                conn.send(("error", error_text(e)))
        elif kind == "shutdown":
            while pending:
                send_oldest()
            return
