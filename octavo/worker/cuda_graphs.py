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


# Mixed batches (prefill chunks + decodes) of up to this many tokens replay a graph too;
# larger steps are compute bound, so launching them eagerly costs little.
MAX_MIXED_GRAPH_TOKENS = 2048


def mixed_token_sizes(max_tokens: int) -> list[int]:
    sizes = [64, 128, 256, 384, 512, 768, 1024, 1536, 2048]
    cap = min(max_tokens, MAX_MIXED_GRAPH_TOKENS)
    return sorted({s for s in sizes if s <= cap} | ({cap} if cap >= 64 else set()))


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
        # Mixed batches: graphs per padded token count, every one over all max_reqs request
        # rows (padding rows have no tokens), so the attention grids are fixed.
        self.mixed_sizes = mixed_token_sizes(buffers.max_tokens)
        self.mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.mixed_outputs: dict[int, torch.Tensor] = {}
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
        b.use_decode_rows(True)  # the rows decode steps write (ModelRunner._forward)
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
        b.flush()
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
        self._capture_mixed()
        logger.info("captured CUDA graphs for decode batch sizes %s and mixed batches of up "
                    "to %s tokens", self.sizes, self.mixed_sizes)

    def _mixed_meta(self, t: int) -> AttentionMetadata:
        b, r = self.buf, self.buf.max_reqs
        # num_tokens=0: the backend zeroes every output row before attention, so padding
        # rows (past the last request's tokens) stay finite whatever the real count is.
        return AttentionMetadata(
            num_tokens=0, num_reqs=r,
            query_start_loc=b.query_start_loc.gpu[: r + 1], seq_lens=b.seq_lens.gpu[:r],
            block_tables=b.block_tables.gpu[:r], slot_mapping=b.slot_mapping.gpu[:t],
            max_query_len=t, max_seq_len=self.max_model_len,
            query_start_loc_cpu=[], seq_lens_cpu=[])

    def _capture_mixed(self) -> None:
        b, r = self.buf, self.buf.max_reqs
        if r < 2 or not self.mixed_sizes:
            return
        b.use_decode_rows(False)  # mixed steps write the max_tokens rows
        for t in reversed(self.mixed_sizes):
            # Dummy: request 0 holds all t tokens (a prefill over block 0, nothing stored).
            b.query_start_loc.np[0] = 0
            b.query_start_loc.np[1: r + 1] = t
            b.seq_lens.np[:r] = 0
            b.seq_lens.np[0] = t
            b.slot_mapping.np[:t] = -1
            b.input_ids.np[:t] = 0
            b.positions.np[:t] = 0
            b.table_slots.np[:r] = b.pad_slot
            self._upload_mixed(t)
            b.flush()
            ctx = ForwardContext(self._mixed_meta(t), self.kv_caches)
            ids, pos = b.input_ids.gpu[:t], b.positions.gpu[:t]
            for _ in range(2):
                self.model(ids, pos, ctx)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model(ids, pos, ctx)
            self.mixed_graphs[t] = graph
            self.mixed_outputs[t] = out
        torch.cuda.synchronize()

    def mixed_size(self, num_tokens: int) -> int | None:
        for s in self.mixed_sizes:
            if s >= num_tokens and s in self.mixed_graphs:
                return s
        return None

    def stage_mixed(self, num_tokens: int, num_reqs: int) -> int:
        """Pad a mixed batch (host rows filled for num_tokens / num_reqs) to its graph and
        upload the inputs (sent by the buffers' flush); returns the graph's token count."""
        t, b, r = self.mixed_size(num_tokens), self.buf, self.buf.max_reqs
        b.input_ids.np[num_tokens:t] = 0
        b.positions.np[num_tokens:t] = 0
        b.slot_mapping.np[num_tokens:t] = -1
        b.query_start_loc.np[num_reqs + 1: r + 1] = num_tokens
        b.seq_lens.np[num_reqs:r] = 0
        b.table_slots.np[num_reqs:r] = b.pad_slot
        self._upload_mixed(t)
        return t

    def _upload_mixed(self, t: int) -> None:
        """Upload a mixed graph's inputs: t token rows, every request row."""
        b, r = self.buf, self.buf.max_reqs
        for buf, n in ((b.input_ids, t), (b.positions, t), (b.slot_mapping, t),
                       (b.query_start_loc, r + 1), (b.seq_lens, r)):
            buf.upload(n)
        b.gather_block_tables(r)

    def replay_mixed(self, t: int, num_tokens: int) -> torch.Tensor:
        self.mixed_graphs[t].replay()
        return self.mixed_outputs[t][:num_tokens]

    def padded_size(self, num_reqs: int) -> int | None:
        for s in self.sizes:
            if s >= num_reqs:
                return s
        return None

    def replay(self, bs: int, num_reqs: int) -> torch.Tensor:
        """Replay the graph of size bs (staged by stage()); the hidden states of the real
        rows."""
        self.graphs[bs].replay()
        return self.outputs[bs][:num_reqs]

    def stage(self, num_reqs: int) -> int:
        """Pad the host rows past num_reqs and upload the inputs (sent by the buffers'
        flush); returns the graph size."""
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
        return bs
