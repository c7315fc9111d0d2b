"""A name -> class table whose built-in entries are import paths, imported only when asked for
(so that optional dependencies load only with the entry that needs them), and whose other
entries are classes registered at run time. Used by the quantization schemes and the
executors."""

from __future__ import annotations

import importlib
from collections.abc import Mapping


class LazyRegistry:
    def __init__(self, param: str, builtin: Mapping[str, str]) -> None:
        """``param``: the argument the names are given as, for errors ("quantization");
        ``builtin``: name -> "module:attribute"."""
        self.param = param
        self.builtin = dict(builtin)
        self.classes: dict[str, type] = {}

    def register(self, name: str, cls: type) -> type:
        self.classes[name] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(set(self.builtin) | set(self.classes))

    def get(self, name: str) -> type:
        """The class for ``name``; ValueError naming the known ones otherwise."""
        if name in self.classes:
            return self.classes[name]
        if name not in self.builtin:
            raise ValueError(f"{self.param}={name!r} is not supported (known: "
                             f"{self.names()})")
        module, attr = self.builtin[name].split(":")
        return getattr(importlib.import_module(module), attr)
