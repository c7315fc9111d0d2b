"""Tensor-parallel group state. Only the trivial single-rank group exists so far; layers read
rank and size from here so that sharding logic is already in place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1

    def all_reduce(self, x):
        if self.size == 1:
            return x
        raise NotImplementedError("multi-rank tensor parallelism is not built yet")

    def all_gather(self, x, dim: int = -1):
        if self.size == 1:
            return x
        raise NotImplementedError("multi-rank tensor parallelism is not built yet")


_TP = TPGroup()


def get_tp_group() -> TPGroup:
    return _TP
