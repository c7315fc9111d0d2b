"""A replica as a Ray actor, under ``distributed_executor_backend="ray"``.

The actor runs a ``ReplicaCore``; it is threaded (``max_concurrency``) so the router's
``submit`` calls run while its reader's long ``poll`` waits for outputs. The cluster is found
as the ``ray`` executor finds it (``ray_executor.connect``). Each actor takes one CPU (and
one GPU on CUDA) when the replica has one rank; a tensor-parallel replica takes nothing
itself and its engine places one rank actor per device, as the ``ray`` executor does.

Plain actors behind Octavo's router, not Ray Serve: Serve adds about 0.5 GiB and opens ports
on every interface.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from octavo.replicas.messages import STATS_INTERVAL_S, ReplicaSpec

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = STATS_INTERVAL_S


class ReplicaActor:
    """The body of one replica's actor (``ray.remote`` is applied by ``RayReplica``)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        logging.basicConfig(level=spec.log_level)
        from octavo.replicas.replica_core import ReplicaCore

        self.core = ReplicaCore(spec, on_fatal=lambda e: os._exit(1))

    def submit(self, msg: tuple) -> None:
        self.core.handle(msg)

    def poll(self, timeout: float) -> list:
        return self.core.take(timeout)

    def shutdown(self) -> None:
        self.core.shutdown()


def replica_resources(tp: int, on_gpu: bool) -> dict[str, float]:
    """What one replica's actor asks of the cluster."""
    if tp > 1:
        return {"num_cpus": 0, "num_gpus": 0}  # its rank actors hold the devices
    return {"num_cpus": 1, "num_gpus": 1 if on_gpu else 0}


def check_cluster(num_replicas: int, tp: int, on_gpu: bool) -> None:
    """Connect to (or start) the cluster; ValueError when it cannot hold the replicas."""
    from octavo.executor.ray_executor import connect, import_ray

    ray = import_ray()
    connect(ray)
    resource = "GPU" if on_gpu else "CPU"
    need = num_replicas * tp
    have = int(ray.cluster_resources().get(resource, 0))
    if need > have:
        raise ValueError(f"num_replicas={num_replicas} x tensor_parallel_size={tp} needs "
                         f"{need} {resource}s in the Ray cluster; it has {have}")


class RayReplica:
    """The router's handle on one replica actor."""

    def __init__(self, spec: ReplicaSpec, tp: int, on_gpu: bool) -> None:
        from octavo.executor.ray_executor import import_ray

        self.spec = spec
        self.pid: int | None = None
        self._ray = import_ray()
        self._options = replica_resources(tp, on_gpu)
        self._actor = None
        self._stopping = False
        # As ProcessReplica: a handle stopped before it started never starts.
        self._life = threading.Lock()
        self._stopped = False

    def start(self, on_batch: Callable[[list], None], on_exit: Callable[[str], None]) -> None:
        ray = self._ray
        cls = ray.remote(ReplicaActor)
        with self._life:
            if self._stopped:
                return
            self._actor = cls.options(max_concurrency=4, **self._options).remote(self.spec)
        actor = self._actor

        def read() -> None:
            why = "it stopped"
            while not self._stopping:
                try:
                    batch = ray.get(actor.poll.remote(POLL_TIMEOUT_S))
                except ray.exceptions.RayActorError as e:
                    cause = getattr(e, "cause", None) or e
                    why = (f"its actor (pid {self.pid}) died: "
                           f"{str(cause).splitlines()[0][:300]}")
                    break
                except ray.exceptions.RayTaskError as e:  # the constructor raised
                    why = f"its actor failed ({str(e).splitlines()[0][:300]})"
                    break
                except Exception as e:  # noqa: BLE001 - Ray going down: the replica is gone
                    why = f"Ray failed ({type(e).__name__}: {e})"
                    break
                for msg in batch:
                    if msg[0] == "ready":
                        self.pid = msg[1]["pid"]
                try:
                    on_batch(batch)
                except Exception:  # noqa: BLE001 - a router bug must not stop the reader
                    logger.exception("replica %d: a batch could not be handled",
                                     self.spec.index)
            on_exit(why)

        threading.Thread(target=read, name=f"octavo-replica-{self.spec.index}-reader",
                         daemon=True).start()

    def send(self, msg: tuple) -> None:
        try:
            self._actor.submit.remote(msg)
        except Exception:  # noqa: BLE001 - a dead actor: its reader reports the death
            pass

    def kill(self) -> None:
        try:
            self._ray.kill(self._actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def stop(self, timeout: float = 10.0) -> None:
        with self._life:  # a start in progress finishes first; a later one is refused
            self._stopped = True
            if self._actor is None:
                return
        try:
            self._ray.get(self._actor.shutdown.remote(), timeout=timeout)
        except Exception:  # noqa: BLE001 - dead or stuck: killed below either way
            pass
        self._stopping = True
        self.kill()
