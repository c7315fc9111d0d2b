"""Host values sent to the device without waiting for it.

A step's per-row data (penalized tokens, bans, guided rows, block copies) is built on the
host while the device still runs the step before. ``torch.tensor(values, device="cuda")`` and
``.to("cuda")`` of pageable memory synchronize the stream: the host then waits for everything
queued, the device idles through the rest of the host's step, and asynchronous scheduling
stops overlapping. Through pinned memory the copy is queued in stream order instead (the
caching host allocator keeps the pinned block until the copy is done).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(values: np.ndarray | Sequence | torch.Tensor, device: torch.device,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (a numpy array, a list, a CPU tensor) as a tensor on ``device``, in
    ``dtype`` where given; on CUDA queued on the current stream without a host wait."""
    if isinstance(values, torch.Tensor):
        t = values
    elif isinstance(values, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(values))
    else:
        t = torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
