"""The weights a decoder layer reads after its attention, pulled into L2 behind it.

``WeightPrefetch`` holds, for one layer, the modules read after its attention in the order
they are read (its o_proj, the MLP's projections, the next layer's qkv_proj), and launches
``octavo.kernels.l2_prefetch`` over their tensors (at most ``OCTAVO_L2_PREFETCH_MB``) right
after attention. Only on NVIDIA sm_90+ with PDL, and for steps of at most
``OCTAVO_L2_PREFETCH_MAX_TOKENS`` tokens (default 1): measured on an H200 (docs/benchmarks.md,
session 17), a one-token step gained ~2% then (Qwen3-0.6B 0.948 -> 0.931 ms, Llama-3.1-8B bf16
and W4A16 -1.3%), while two tokens and up lose (batch 32 +19%: the next kernel waits for the
prefetch launch to land its 31.5 MB). Off by default since session 33 (``OCTAVO_L2_PREFETCH``):
with today's kernels it cost one-token steps on an H200 (Qwen3-0.6B 0.884 -> 0.952 ms,
Llama-3.1-8B fp8 2.547 -> 2.594), W8A16 g128 alone gaining 1.3%.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo import envs


class WeightPrefetch:
    def __init__(self, modules: dict[str, list[nn.Module]]) -> None:
        # part ("o", "mlp", "qkv") -> modules read in that order; OCTAVO_L2_PREFETCH selects.
        self._modules = modules
        self._table: torch.Tensor | None = None
        self._key: tuple | None = None

    def _tensors(self, wanted) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for name, mods in self._modules.items():
            if name not in wanted:
                continue
            for mod in mods:
                for t in list(mod.parameters()) + list(mod.buffers()):
                    if t.is_cuda and t.numel() > 0:
                        out.append(t)
        return out

    def __call__(self, batch_tokens: int, device: torch.device) -> None:
        """Launch the prefetch after a layer's attention (a no-op where it does not apply)."""
        if device.type != "cuda" or batch_tokens > envs.l2_prefetch_max_tokens():
            return
        wanted = envs.l2_prefetch()
        if not wanted:
            return
        from octavo.kernels import l2_prefetch

        if not l2_prefetch.supported(device):
            return
        tensors = self._tensors(wanted)
        if not tensors:
            return
        budget = envs.l2_prefetch_mb() << 20
        # Weights are final after loading, but a reload or repack moves them: rebuild then
        # (never during a graph capture: the warm-up steps before it build the table).
        key = (budget, tuple((t.data_ptr(), t.numel()) for t in tensors))
        if self._key != key:
            self._table = l2_prefetch.chunk_table(tensors, budget)
            self._key = key
        l2_prefetch.l2_prefetch(self._table)
