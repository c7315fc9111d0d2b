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
        self.block_tables = _Buffer((max_reqs, max_blocks), torch.int32, device)
        self.logits_indices = _Buffer((max_reqs,), torch.int64, device)
        self.max_tokens = max_tokens
        self.max_reqs = max_reqs
        self.max_blocks = max_blocks
