"""CPU copies of KV blocks for requests preempted by swap, and the block copies both ways."""

from __future__ import annotations

import torch


def num_swap_blocks(swap_space_gib: float, bytes_per_block: int) -> int:
    """How many blocks (every layer's K and V) ``swap_space_gib`` GiB of CPU memory hold."""
    return int(swap_space_gib * (1 << 30)) // bytes_per_block


def _runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(src, dst, length) runs of consecutive pairs whose source and destination both step
    by one: one copy per run instead of one per block."""
    runs: list[tuple[int, int, int]] = []
    for s, d in pairs:
        if runs:
            s0, d0, n = runs[-1]
            if s == s0 + n and d == d0 + n:
                runs[-1] = (s0, d0, n + 1)
                continue
        runs.append((s, d, 1))
    return runs


class SwapCache:
    """One CPU tensor per layer, shaped like the device cache but with ``num_cpu_blocks``
    along dim 1, the block dim of every attention backend's layout ([2, nb, ...]).

    On CUDA the CPU tensors are pinned and the copies are asynchronous on the current
    stream, so they stay ordered with the forward pass launched after them and with the
    copies of other steps; the host never reads these tensors, so nothing waits for them.
    """

    def __init__(self, device_caches: list[torch.Tensor], num_cpu_blocks: int) -> None:
        if num_cpu_blocks < 1:
            raise ValueError(f"num_cpu_blocks must be >= 1, got {num_cpu_blocks}")
        self.device_caches = device_caches
        self.num_blocks = num_cpu_blocks
        self._async = bool(device_caches) and device_caches[0].is_cuda
        # Uninitialized: a CPU block is read only after a swap-out has written it.
        self.cpu_caches = [
            torch.empty((c.shape[0], num_cpu_blocks, *c.shape[2:]), dtype=c.dtype,
                        pin_memory=self._async)
            for c in device_caches]

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Swap-outs (device block, CPU block) first, then swap-ins (CPU block, device
        block): a device block freed by a swap-out may be a swap-in's destination."""
        self._copy(self.device_caches, self.cpu_caches, swap_out)
        self._copy(self.cpu_caches, self.device_caches, swap_in)

    def _copy(self, src_caches: list[torch.Tensor], dst_caches: list[torch.Tensor],
              pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        runs = _runs(pairs)
        for src, dst in zip(src_caches, dst_caches):
            for kv in range(src.shape[0]):  # K then V: each run of blocks is contiguous
                s_kv, d_kv = src[kv], dst[kv]
                for s, d, n in runs:
                    d_kv[d: d + n].copy_(s_kv[s: s + n], non_blocking=self._async)
