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

import traceback
from collections import deque

POLL_S = 0.0002  # while the device runs a step: how long to wait for a message per round


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def worker_main(conn, config, rank: int = 0, port: int = 0) -> None:
    import torch

    from octavo.distributed.parallel_state import init_tensor_parallel
    from octavo.worker.worker import Worker, resolve_device

    tp = config.parallel_config.tensor_parallel_size
    try:
        device = resolve_device(config.device_config.device)
        if device.type == "cuda" and tp > 1:
            # One GPU per rank: the engine resolved "auto" to its own device; rank r takes
            # GPU r (NCCL refuses two ranks on one device).
            import dataclasses

            torch.cuda.set_device(rank)
            config = dataclasses.replace(config, device_config=dataclasses.replace(
                config.device_config, device=f"cuda:{rank}"))
        init_tensor_parallel(rank, tp, port, device.type)
        worker = Worker(config)
        conn.send(("sized", worker.load_and_size()))
        kind, sizes = conn.recv()
        if kind != "init":
            return
        worker.init_kv_cache(*sizes)
        conn.send(("ready", None))
    except BaseException as e:  # the parent raises with this text
        conn.send(("error", _error_text(e) + "\n" + traceback.format_exc()))
        return
    replies = rank == 0
    failed_launch: str | None = None  # a deferred step's launch error, sent at its sample
    pending: deque = deque()  # StepHandle, or the error text of a step that failed to launch

    def send_oldest() -> None:
        item = pending.popleft()
        if not replies:  # other ranks only keep their state in step
            if not isinstance(item, str):
                try:
                    item.result()
                except Exception:
                    pass
            return
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
                handle = worker.execute_model_async(payload)
                if handle is not None:  # else its handle comes with ("sample", bitmask)
                    pending.append(handle)
            except Exception as e:
                # A deferred step that failed to launch still answers once, at its sample.
                if payload.defer_sampling:
                    failed_launch = _error_text(e)
                else:
                    pending.append(_error_text(e))
        elif kind == "sample":
            try:
                if failed_launch is not None:
                    pending.append(failed_launch)
                else:
                    pending.append(worker.sample_tokens(payload))
            except Exception as e:
                pending.append(_error_text(e))
            failed_launch = None
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
