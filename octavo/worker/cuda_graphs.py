"""CUDA graphs for decode-only steps, one per padded batch size.

A decode step launches hundreds of small kernels; replaying a captured graph turns that CPU
work into one launch. Graphs read the persistent input buffers, so a step only fills them.
"""

from __future__ import annotations

import logging

import torch

from octavo.attention.backend import AttentionMetadata
from octavo.attention.layer import ForwardContext
from octavo.worker.input_buffers import InputBuffers

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 16))
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


class CudaGraphRunner:
    def __init__(self, model, buffers: InputBuffers, kv_caches: list[torch.Tensor],
                 max_bs: int, max_model_len: int) -> None:
        self.model = model
        self.buf = buffers
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = graph_batch_sizes(max_bs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _meta(self, bs: int) -> AttentionMetadata:
        b = self.buf
        return AttentionMetadata(
            num_tokens=bs, num_reqs=bs,
            query_start_loc=b.query_start_loc.gpu[: bs + 1], seq_lens=b.seq_lens.gpu[:bs],
            block_tables=b.block_tables.gpu[:bs], slot_mapping=b.slot_mapping.gpu[:bs],
            max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc_cpu=[], seq_lens_cpu=[])

    @torch.inference_mode()
    def capture(self) -> None:
        b = self.buf
        # Dummy decode inputs: one token per request, context of one token, slot -1 (no write).
        n = self.sizes[-1]
        b.query_start_loc.np[: n + 1] = range(n + 1)
        b.seq_lens.np[:n] = 1
        b.slot_mapping.np[:n] = -1
        b.input_ids.np[:n] = 0
        b.positions.np[:n] = 0
        b.table_slots.np[:n] = b.pad_slot
        for buf in (b.query_start_loc, b.seq_lens, b.slot_mapping, b.input_ids, b.positions):
            buf.upload(buf.np.shape[0] if buf is b.query_start_loc else n)
        b.gather_block_tables(n)
        torch.cuda.synchronize()
        for bs in reversed(self.sizes):
            ctx = ForwardContext(self._meta(bs), self.kv_caches)
            ids, pos = b.input_ids.gpu[:bs], b.positions.gpu[:bs]
            for _ in range(2):  # warm up: Triton compiles, cuBLAS picks algorithms
                self.model(ids, pos, ctx)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model(ids, pos, ctx)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def padded_size(self, num_reqs: int) -> int | None:
        for s in self.sizes:
            if s >= num_reqs:
                return s
        return None

    def run(self, num_reqs: int) -> torch.Tensor:
        """Replay for a decode batch whose first num_reqs rows are filled (host side) and
        padded here; returns the hidden states of the real rows."""
        bs = self.padded_size(num_reqs)
        b = self.buf
        if bs > num_reqs:
            b.query_start_loc.np[num_reqs + 1: bs + 1] = range(num_reqs + 1, bs + 1)
            b.seq_lens.np[num_reqs:bs] = 1
            b.slot_mapping.np[num_reqs:bs] = -1
            b.input_ids.np[num_reqs:bs] = 0
            b.positions.np[num_reqs:bs] = 0
            b.table_slots.np[num_reqs:bs] = b.pad_slot
        b.input_ids.upload(bs)
        b.positions.upload(bs)
        b.slot_mapping.upload(bs)
        b.query_start_loc.upload(bs + 1)
        b.seq_lens.upload(bs)
        b.gather_block_tables(bs)
        self.graphs[bs].replay()
        return self.outputs[bs][:num_reqs]
