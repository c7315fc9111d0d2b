"""What crosses between the router and a replica: plain picklable tuples, batched in lists.

Router -> replica (one message per call):
    ("add", request_id, prompt, SamplingParams, priority, group_id)
    ("abort", request_id)
    ("shutdown",)
Replica -> router (a list of these per send):
    ("ready", {"pid": int})          the engine is built; requests may come
    ("start_error", text)            the engine could not be built (the replica then exits)
    ("out", request_id, RequestOutput)   a request's first output
    ("more", request_id, RequestOutput)  a later one, without the prompt (prompt and
                                     prompt_token_ids None: as in the first; metrics None
                                     until the last): the prompt is not pickled every step
    ("delta", request_id, index, text, token_ids)
                                     a later unfinished one of one completion without
                                     logprobs (most of a stream), as plain values
    ("fail", request_id, kind, text, param)
                                     kind: "invalid" (ValueError), "failed" (the request
                                     failed in the engine), "dead" (the engine died);
                                     param: the request's field at fault, or None
    ("stats", snapshot, stuck_s)     every STATS_INTERVAL_S: the replica's Prometheus
                                     snapshot (``metrics.snapshot``) and the seconds its
                                     engine has had requests without finishing a step;
                                     doubles as a heartbeat
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from octavo.engine.arg_utils import EngineArgs
from octavo.errors import InvalidRequestError, RequestFailedError

# A replica sends its stats (and so shows it is alive) this often, busy or idle.
STATS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica needs to build its engine: picklable, sent once at start."""

    engine_args: EngineArgs
    index: int
    model_name: str  # the served name: the model_name label of its metrics
    log_stats_interval: float | None = None  # None: no periodic stats line
    log_level: int = logging.INFO
    cuda_visible_devices: str | None = None  # a process replica's GPUs on CUDA
    # On the CPU, a process replica's share of the cores (OMP_NUM_THREADS for it and its
    # ranks): N replicas that each start one thread per core would oversubscribe them.
    cpu_threads: int | None = None


class Outbox:
    """Messages a replica has for the router, taken in batches by one sender."""

    def __init__(self) -> None:
        self._items: list = []
        self._cond = threading.Condition()

    def put(self, item) -> None:
        with self._cond:
            self._items.append(item)
            if len(self._items) == 1:
                self._cond.notify()

    def put_many(self, items: list) -> None:
        with self._cond:
            was_empty = not self._items
            self._items.extend(items)
            if was_empty:
                self._cond.notify()

    def take(self, timeout: float) -> list:
        """Everything queued, waiting up to ``timeout`` seconds for something."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            items, self._items = self._items, []
            return items


def fail_message(request_id: str, error: BaseException) -> tuple:
    from octavo.engine.async_llm import EngineDeadError

    if isinstance(error, EngineDeadError):
        kind = "dead"
    elif isinstance(error, ValueError):
        kind = "invalid"
    else:
        kind = "failed"
    return ("fail", request_id, kind, str(error), getattr(error, "param", None))


def fail_error(request_id: str, kind: str, text: str, param: str | None,
               replica: int) -> BaseException:
    """The exception a ("fail", ...) message stands for, on the router's side."""
    if kind == "invalid":  # the field named, as the replica's InvalidRequestError did
        return InvalidRequestError(param, text)
    return RequestFailedError(request_id, f"replica {replica}: {text}",
                              param if kind == "failed" else None)
