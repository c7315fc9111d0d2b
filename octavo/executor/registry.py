"""``distributed_executor_backend`` names -> Executor classes (imported only when asked for)."""

from __future__ import annotations

import importlib

from octavo.executor.base import Executor

_BUILTIN = {
    "uni": "octavo.executor.uniproc:UniProcExecutor",
    "mp": "octavo.executor.multiproc:MultiprocExecutor",
    "ray": "octavo.executor.ray_executor:RayExecutor",
}
_CLASSES: dict[str, type[Executor]] = {}


def register_executor(name: str):
    def deco(cls: type[Executor]) -> type[Executor]:
        _CLASSES[name] = cls
        return cls
    return deco


def known_backends() -> list[str]:
    return sorted(set(_BUILTIN) | set(_CLASSES))


def get_executor_class(name: str) -> type[Executor]:
    if name in _CLASSES:
        return _CLASSES[name]
    if name not in _BUILTIN:
        raise ValueError(f"distributed_executor_backend={name!r} is not supported (known: "
                         f"{known_backends()})")
    module, cls_name = _BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), cls_name)
