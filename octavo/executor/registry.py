"""``distributed_executor_backend`` names -> Executor classes (imported only when asked for)."""

from __future__ import annotations

from octavo.executor.base import Executor
from octavo.lazy_registry import LazyRegistry

_REGISTRY = LazyRegistry("distributed_executor_backend", {
    "uni": "octavo.executor.uniproc:UniProcExecutor",
    "mp": "octavo.executor.multiproc:MultiprocExecutor",
    "ray": "octavo.executor.ray_executor:RayExecutor",
})


def register_executor(name: str):
    def deco(cls: type[Executor]) -> type[Executor]:
        return _REGISTRY.register(name, cls)
    return deco


def known_backends() -> list[str]:
    return _REGISTRY.names()


def get_executor_class(name: str) -> type[Executor]:
    return _REGISTRY.get(name)
