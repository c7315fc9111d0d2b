"""Executor with one Ray actor per tensor-parallel rank (``distributed_executor_backend="ray"``).

Ray is found the way Ray finds it: the cluster this process is already connected to, else
the one ``RAY_ADDRESS`` names (an error if nothing answers there), else the one last started
with ``ray start`` on this machine (as ``address="auto"`` finds it), else a local one started
here (no dashboard). The actors are placed by a placement group, one bundle per rank
(``num_cpus=1`` on the CPU, ``num_gpus=1`` on CUDA), ``STRICT_PACK`` on one node: the
torch.distributed rendezvous is a free port on this machine's loopback.

Listening: what Octavo opens itself (the rendezvous) is on 127.0.0.1. Ray's own servers (GCS,
raylet, object manager, actors) are Ray's to bind: Ray 2.60 turns a loopback node address
into the machine's IP and listens on all interfaces, behind its token authentication (on by
default).

Each actor holds a ``WorkerRank`` (the same worker logic as the ``mp`` processes). A step is
put in Ray's object store once and every rank's ``step`` is called on it; rank 0's
``ObjectRef`` carries the tokens (every rank samples identically, see ``MultiprocExecutor``).
The engine's host work overlaps the actors' step because ``execute_model_async`` returns at
once; an actor runs its steps one after another (its next step's host work does not overlap
its device work, as it does in an ``mp`` worker).
"""

from __future__ import annotations

import os
from collections import deque

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.executor.base import QueuedStep, RemoteExecutor
from octavo.executor.multiproc import WorkerDiedError, _free_port
from octavo.executor.worker_rank import WorkerRank, error_text

PLACEMENT_TIMEOUT_S = 60.0
INSTALL_HINT = "pip install octavo[distributed]"


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"distributed_executor_backend='ray' needs Ray, which is not "
                          f"installed here ({e}): {INSTALL_HINT}") from None
    return ray


def connect(ray) -> None:
    """Join the running cluster (this process's, RAY_ADDRESS's, or ``ray start``'s) or start
    a local one."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        address = _started_cluster()
        if address is not None and _unreachable(address) is not None:
            address = None  # the record of a cluster since gone (stopped without `ray stop`)
    if address is None:
        ray.init(include_dashboard=False, log_to_driver=False)
        return
    # ray.init waits for a cluster that is not there for minutes: ask the port first.
    problem = _unreachable(address)
    if problem is None:
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError, TimeoutError) as e:
            problem = f"{type(e).__name__}: {e}"
    where = (f"RAY_ADDRESS={address!r}" if os.environ.get("RAY_ADDRESS")
             else f"{address!r} (the cluster `ray start` recorded)")
    raise ConnectionError(f"no Ray cluster answers at {where} ({problem}); start one with "
                          "`ray start --head`, or unset RAY_ADDRESS to start a local one")


def _started_cluster() -> str | None:
    """The address of the cluster last started on this machine with ``ray start`` (Ray's
    record of it, which ``address="auto"`` reads first), or None. Unlike Ray's "auto", a
    cluster that another program started privately with ``ray.init()`` is not joined."""
    try:
        from ray._private.services import find_bootstrap_address

        return find_bootstrap_address(None)
    except Exception:  # a Ray whose private lookup moved: start a local cluster
        return None


def _unreachable(address: str) -> str | None:
    """Why nothing listens at ``address`` (host:port, or ray://host:port), or None."""
    import socket

    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return None
    except ValueError:
        return None  # not host:port: let Ray judge it
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def _cause_text(e) -> str:
    cause = getattr(e, "cause", None)
    return error_text(cause) if isinstance(cause, BaseException) else str(e)


class RankActor:
    """The body of one rank's actor (``ray.remote`` is applied when Ray is imported)."""

    def __init__(self, config: EngineConfig, rank: int, port: int) -> None:
        # Ray shows an actor only its own GPU (CUDA_VISIBLE_DEVICES): index 0.
        self.rank = WorkerRank(config, rank, port, cuda_index=0)

    def pid(self) -> int:
        return os.getpid()

    def load_and_size(self) -> tuple[int, int]:
        return self.rank.load_and_size()

    def init_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        self.rank.init_kv_cache(num_blocks, num_cpu_blocks)

    def step(self, sched: SchedulerOutput):
        """The rank's answer (``WorkerRank.answer``); None for a step launched with
        ``defer_sampling``, which answers at ``sample``."""
        item = self.rank.launch(sched)
        return None if item is None else self.rank.answer(item)

    def sample(self, grammar):
        """Sample the step launched with ``defer_sampling``; answers as ``step`` does."""
        return self.rank.answer(self.rank.sample(grammar))

    def reset(self) -> None:
        self.rank.reset()


class RayExecutor(RemoteExecutor):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        ray = self._ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        tp = config.parallel_config.tensor_parallel_size
        from octavo.worker.worker import resolve_device

        on_gpu = resolve_device(config.device_config.device).type == "cuda"
        connect(ray)
        resource = "GPU" if on_gpu else "CPU"
        have = int(ray.cluster_resources().get(resource, 0))
        if tp > have:
            raise ValueError(f"tensor_parallel_size={tp} needs {tp} {resource}s in the Ray "
                             f"cluster (one actor each); it has {have}")
        bundle = {"GPU": 1, "CPU": 1} if on_gpu else {"CPU": 1}
        self._pg = placement_group([dict(bundle) for _ in range(tp)], strategy="STRICT_PACK")
        self._remove_pg = remove_placement_group
        self.actors: list = []
        try:
            ready, _ = ray.wait([self._pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"the Ray cluster could not place {tp} actors of {bundle} "
                                   f"on one node within {PLACEMENT_TIMEOUT_S:.0f} s "
                                   f"(available: {ray.available_resources()})")
            actor_cls = ray.remote(RankActor)
            port = _free_port() if tp > 1 else 0
            for rank in range(tp):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=rank)
                self.actors.append(actor_cls.options(
                    num_cpus=1, num_gpus=1 if on_gpu else 0, scheduling_strategy=strategy,
                    ).remote(config, rank, port))
            sizes = self._get([a.load_and_size.remote() for a in self.actors], "start")
            self.num_blocks = min(s[0] for s in sizes)  # what every rank can hold
            self.num_cpu_blocks = min(s[1] for s in sizes)
            self._get([a.init_kv_cache.remote(self.num_blocks, self.num_cpu_blocks)
                       for a in self.actors], "start")
        except BaseException:
            self.shutdown()
            raise

    def _get(self, refs: list, doing: str) -> list:
        """Every ref's value; the first failure (a rank that raised or died) raises at once,
        so a dead rank does not leave the others waiting in a collective unseen."""
        ray = self._ray
        values: dict = {}
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            ref = done[0]
            rank = refs.index(ref)
            try:
                values[rank] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                raise WorkerDiedError(f"the worker actor of rank {rank} died: {e}") from None
            except ray.exceptions.RayTaskError as e:
                raise RuntimeError(f"worker actor {rank} could not {doing}: "
                                   f"{_cause_text(e)}") from None
        return [values[r] for r in range(len(refs))]

    def _next_answer(self, head: QueuedStep) -> tuple[str, object]:
        return self._get(head._refs, "run a step")[0]

    # ------------------------------------------------------------------ Executor
    def execute_model_async(self, sched: SchedulerOutput) -> QueuedStep | None:
        ref = self._ray.put(sched) if len(self.actors) > 1 else sched  # pickled once
        refs = [a.step.remote(ref) for a in self.actors]
        if sched.defer_sampling:  # an actor runs its calls in order: sample comes next
            return None
        return self._track(refs)

    def sample_tokens(self, grammar) -> QueuedStep:
        ref = self._ray.put(grammar) if len(self.actors) > 1 else grammar
        return self._track([a.sample.remote(ref) for a in self.actors])

    def reset(self) -> None:
        self._drain()  # abandoned steps still run, in order, before the reset
        self._get([a.reset.remote() for a in self.actors], "reset")

    def shutdown(self) -> None:
        for actor in getattr(self, "actors", ()):
            try:
                self._ray.kill(actor)
            except Exception:
                pass
        self.actors = []
        self._pending = deque()
        pg = getattr(self, "_pg", None)
        if pg is not None:
            try:
                self._remove_pg(pg)
            except Exception:
                pass
            self._pg = None
