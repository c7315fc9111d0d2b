"""Replicas: N engine processes behind one endpoint (``--num-replicas N`` on the servers,
``LLM(data_parallel_size=N)`` offline).

The API server's own engine thread shares the server's GIL, so replicas are processes: plain
``multiprocessing`` spawn processes (``replica_process``) or Ray actors (``ray_replica``)
under ``distributed_executor_backend="ray"``; each owns an AsyncLLM (``replica_core``) and
may itself be tensor-parallel. Messages either way are plain picklable tuples
(``messages``).

``ReplicaRouter`` (``router``) presents the AsyncLLM interface the servers already use
(generate / abort / health / shutdown, plus a ``RouterFront`` as ``.engine`` for the
validation the servers run before queueing), sends each request to the least-loaded ready
replica (``policy``), restarts a replica that dies (``supervisor``) and fails or retries its
in-flight requests. ``metrics`` turns each replica's Prometheus snapshot into the server's
``/metrics`` with a ``replica`` label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.replicas.router import ReplicaRouter

__all__ = ["ReplicaRouter"]


def __getattr__(name: str):
    # Lazy: a replica process imports this package before it picks its GPUs
    # (CUDA_VISIBLE_DEVICES), so the package itself must not pull in the engine.
    if name == "ReplicaRouter":
        from octavo.replicas.router import ReplicaRouter

        return ReplicaRouter
    raise AttributeError(f"module 'octavo.replicas' has no attribute {name!r}")
