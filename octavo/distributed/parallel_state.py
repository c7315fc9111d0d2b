"""Tensor-parallel group state: this process's rank and the group's size, and the collectives
the sharded layers call. One rank (the default) needs no torch.distributed at all; several
ranks are one process each (the "mp" executor), joined through torch.distributed with gloo
on the CPU and NCCL on CUDA. Layers read the group when they are built, so a worker process
calls ``init_tensor_parallel`` before it builds its model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo import envs


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks (every rank gets the same values)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        if _CUSTOM is not None and _CUSTOM.eligible(x):
            return _CUSTOM.all_reduce(x)
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' ``x`` concatenated along ``dim``, in rank order."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim)


_TP = TPGroup()
_CUSTOM = None  # octavo.distributed.custom_all_reduce.CustomAllReduce, on CUDA with peer access


def get_tp_group() -> TPGroup:
    return _TP


def init_tensor_parallel(rank: int, size: int, port: int, device_type: str) -> None:
    """Join the group of ``size`` ranks on this machine (loopback, ``port``) as ``rank``."""
    global _TP, _CUSTOM
    if size > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size)
        if device_type == "cuda" and envs.custom_all_reduce():
            from octavo.distributed.custom_all_reduce import create

            _CUSTOM = create(rank, size, torch.device("cuda", torch.cuda.current_device()))
    _TP = TPGroup(rank, size)
