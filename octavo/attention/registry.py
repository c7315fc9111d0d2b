"""Attention backends by name; chosen by device unless the config names one."""

from __future__ import annotations

import importlib

import torch

from octavo.attention.backend import AttentionBackend

# name -> "module:Class", imported lazily (triton may be absent).
_BACKENDS = {
    "torch": "octavo.attention.torch_backend:TorchAttentionBackend",
    "triton": "octavo.attention.triton_backend:TritonAttentionBackend",
}


def register_backend(name: str, target: str) -> None:
    _BACKENDS[name] = target


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in _BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown (known: {sorted(_BACKENDS)})")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def select_backend(device: torch.device, name: str | None = None) -> type[AttentionBackend]:
    if name is not None:
        return get_backend(name)
    if device.type == "cuda":
        try:
            return get_backend("triton")
        except ImportError:
            pass
    return get_backend("torch")
