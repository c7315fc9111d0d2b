"""The weights a decoder layer reads after its attention, pulled into L2 while attention runs.

A layer's attention launch is followed by projections whose weights no kernel of the step
writes. ``WeightPrefetch`` holds, for one layer, the modules read after its attention (by
default its o_proj, the MLP's projections and the next layer's qkv_proj: the
``OCTAVO_L2_PREFETCH`` list), and launches ``octavo.kernels.l2_prefetch`` over their tensors
(at most ``OCTAVO_L2_PREFETCH_MB``, in the order they are read) right after attention. Only
on NVIDIA sm_90+ with PDL and for batches of at most ``OCTAVO_L2_PREFETCH_MAX_TOKENS`` tokens
(decode steps; a prefill's projections are compute-bound).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo import envs


class WeightPrefetch:
    def __init__(self, modules: dict[str, nn.Module]) -> None:
        # name ("o", "mlp", "qkv") -> modules read in that order; the names select by env.
        self._modules = modules
        self._table: torch.Tensor | None = None
        self._key: tuple | None = None

    def _tensors(self) -> list[torch.Tensor]:
        wanted = envs.l2_prefetch()
        out: list[torch.Tensor] = []
        for name, mods in self._modules.items():
            if name not in wanted:
                continue
            for mod in mods:
                for t in list(mod.parameters()) + list(mod.buffers()):
                    if t.is_cuda and t.numel() > 0:
                        out.append(t)
        return out

    def __call__(self, point: str, batch_tokens: int, device: torch.device) -> None:
        """Launch the prefetch if ``point`` ("attn": before the attention launch, "o": after
        it) is where OCTAVO_L2_PREFETCH_AT puts it; a no-op where it does not apply."""
        if (device.type != "cuda" or not envs.l2_prefetch()
                or envs.l2_prefetch_at() != point
                or batch_tokens > envs.l2_prefetch_max_tokens()):
            return
        from octavo.kernels import l2_prefetch

        if not l2_prefetch.supported(device):
            return
        tensors = self._tensors()
        if not tensors:
            return
        budget = envs.l2_prefetch_mb() << 20
        # Weights are final after loading, but a reload or repack moves them: rebuild then
        # (never during a graph capture: the warm-up steps before it build the table).
        chunk = envs.l2_prefetch_chunk_kb() << 10
        key = (budget, chunk, tuple((t.data_ptr(), t.numel()) for t in tensors))
        if self._key != key:
            self._table = l2_prefetch.chunk_table(tensors, budget, chunk)
            self._key = key
        evict_last = envs.l2_prefetch_evict_last()
        if not envs.l2_prefetch_side_stream():
            # In the PDL chain: the next kernel waits for the prefetch to complete.
            l2_prefetch.l2_prefetch(self._table, evict_last=evict_last,
                                    lines=chunk if envs.l2_prefetch_lines() else 0)
            return
        # On a side stream forked here: the prefetch runs beside the chain (which never
        # waits for it) and is joined at the end of the forward pass (``join``).
        main = torch.cuda.current_stream(device)
        side = _side_stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            l2_prefetch.l2_prefetch(self._table, evict_last=evict_last, pdl=False,
                                    lines=chunk if envs.l2_prefetch_lines() else 0)
        _pending.add(device)

    @staticmethod
    def join(device: torch.device) -> None:
        """Make the current stream wait for the side stream's prefetches (a CUDA graph
        capture must end joined); a no-op when none was launched."""
        if device in _pending:
            _pending.discard(device)
            torch.cuda.current_stream(device).wait_stream(_side_stream(device))


_streams: dict[torch.device, torch.cuda.Stream] = {}
_pending: set[torch.device] = set()


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _streams:
        _streams[device] = torch.cuda.Stream(device)
    return _streams[device]
