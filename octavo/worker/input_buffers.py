"""Persistent per-step input tensors: host staging arrays (pinned on CUDA) and device copies
at fixed addresses, so steps allocate nothing and CUDA graphs can replay over them."""

from __future__ import annotations

import numpy as np
import torch


class _Buffer:
    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill: int = 0) -> None:
        pin = device.type == "cuda"
        self.cpu = torch.full(shape, fill, dtype=dtype, pin_memory=pin)
        self.np: np.ndarray = self.cpu.numpy()
        self.gpu = self.cpu if device.type == "cpu" else torch.full(
            shape, fill, dtype=dtype, device=device)

    def put(self, values) -> torch.Tensor:
        """Fill the first len(values) rows from a sequence and upload them (asynchronously
        from pinned memory: no wait for the device)."""
        n = len(values)
        self.np[:n] = values
        return self.upload(n)

    def upload(self, n: int) -> torch.Tensor:
        """Copy the first n rows to the device; returns that device slice."""
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class InputBuffers:
    def __init__(self, max_tokens: int, max_reqs: int, max_blocks: int,
                 device: torch.device) -> None:
        self.input_ids = _Buffer((max_tokens,), torch.int64, device)
        self.positions = _Buffer((max_tokens,), torch.int64, device)
        self.slot_mapping = _Buffer((max_tokens,), torch.int64, device, fill=-1)
        self.query_start_loc = _Buffer((max_reqs + 1,), torch.int32, device)
        self.seq_lens = _Buffer((max_reqs,), torch.int32, device)
        # Per-step block tables, one row per batch row: gathered on the device from
        # req_tables, a persistent table with one row ("slot") per live request that the
        # host only appends new block ids to. Row max_reqs stays zero (padding rows).
        self.block_tables = _Buffer((max_reqs, max_blocks), torch.int32, device)
        self.req_tables = _Buffer((max_reqs + 1, max_blocks), torch.int32, device)
        self.table_slots = _Buffer((max_reqs,), torch.int64, device)
        self.logits_indices = _Buffer((max_reqs,), torch.int64, device)
        # Per-row sampling parameters (filled only on steps that need them).
        self.temperature = _Buffer((max_reqs,), torch.float32, device)
        self.top_k = _Buffer((max_reqs,), torch.int64, device)
        self.top_p = _Buffer((max_reqs,), torch.float32, device)
        self.min_p = _Buffer((max_reqs,), torch.float32, device)
        # Inputs that are the previous step's samples (asynchronous scheduling): batch
        # positions, and rows of the previous step's sampled-token tensor.
        self.fix_dst = _Buffer((max_reqs,), torch.int64, device)
        self.fix_src = _Buffer((max_reqs,), torch.int64, device)
        self.max_tokens = max_tokens
        self.max_reqs = max_reqs
        self.max_blocks = max_blocks
        self.pad_slot = max_reqs
        self._free_slots = list(range(max_reqs - 1, -1, -1))
        self._dirty_slots = 0  # rows [0, _dirty_slots) of req_tables are uploaded per step

    def take_slot(self) -> int:
        if not self._free_slots:
            raise RuntimeError(f"more than max_num_seqs={self.max_reqs} live requests in "
                               "the worker")
        slot = self._free_slots.pop()
        self.req_tables.np[slot] = 0
        self._dirty_slots = max(self._dirty_slots, slot + 1)
        return slot

    def release_slot(self, slot: int) -> None:
        if slot >= 0:
            self._free_slots.append(slot)

    def gather_block_tables(self, b: int) -> torch.Tensor:
        """Upload the persistent table and the batch's slots (rows [0, b) of table_slots,
        filled by the host), and gather the batch's block tables on the device."""
        self.req_tables.upload(self._dirty_slots)
        slots = self.table_slots.upload(b)
        out = self.block_tables.gpu[:b]
        torch.index_select(self.req_tables.gpu, 0, slots, out=out)
        return out
