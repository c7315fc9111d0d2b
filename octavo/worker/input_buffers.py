"""Persistent per-step input tensors: host staging arrays (pinned on CUDA) and device copies
at fixed addresses, so steps allocate nothing and CUDA graphs can replay over them.

Packed (OCTAVO_PACKED_INPUTS, default on, CUDA only): every field is a typed view at a fixed,
aligned byte offset of one pinned host arena, mirrored by a device arena of the same layout.
``upload(n)`` only records the bytes the step wrote (the field's first n rows); ``flush()``
sends the smallest byte range spanning every recorded extent in one copy, then gathers the
batch's block tables on the device. The range may cover bytes the step did not write (other
fields, rows past a field's n): that is harmless, because every device byte a step reads is
either sent by that step's flush, or a ``req_tables`` row, whose host side is the truth and
every live row of which ([0, dirty)) goes up every step; the only device-side writes to the
arena (the in-flight token fixes into ``input_ids``) land in rows the next step re-sends
before reading. Unpacked: one copy per field per ``upload`` (the previous behaviour).

The three per-token fields (token ids, positions, KV slots) have ``max_tokens`` rows. Laid
end to end, a one-token-per-request step's range would span two of them whole (tens of KiB
at the default 8192 tokens); so packed buffers hold a second, ``max_reqs``-row set of them
next to the per-request fields, which decode steps (and the decode CUDA graphs) use:
``use_decode_rows(True)``. Which set ``input_ids`` / ``positions`` / ``slot_mapping`` name is
chosen at the start of each step, before any row is written.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from octavo import envs

ALIGN = 128  # bytes: every field starts on a cache line (Triton wants >= 16)


def arena_layout(specs, align: int = ALIGN) -> tuple[dict[str, tuple[int, int]], int]:
    """``specs``: (name, shape, dtype) in arena order. Returns each field's (byte offset,
    byte size), offsets multiples of ``align``, fields back to back in order; and the
    arena's size in bytes (a multiple of ``align``)."""
    layout, off = {}, 0
    for name, shape, dtype in specs:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        layout[name] = (off, size)
        off += -(-size // align) * align
    return layout, off


def copy_span(extents) -> tuple[int, int] | None:
    """The byte range [lo, hi) one copy must send to cover every (lo, hi) extent of a step
    (empty extents ignored); None when there is nothing to send."""
    lo = hi = None
    for a, b in extents:
        if b > a:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return None if lo is None else (lo, hi)


class _Arena:
    """One host byte arena (pinned on CUDA) and its device mirror; the extents written since
    the last flush."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        # A separate tensor even on the CPU (tests simulate the device path there).
        self.dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.lo, self.hi = nbytes, 0  # pending byte range; empty when lo >= hi
        self.copies = 0  # flushes that sent bytes (tests)

    def view(self, offset: int, shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return (self.host[offset: offset + size].view(dtype).view(shape),
                self.dev[offset: offset + size].view(dtype).view(shape))

    def touch(self, lo: int, hi: int) -> None:
        span = copy_span([(self.lo, self.hi), (lo, hi)])
        if span is not None:
            self.lo, self.hi = span

    def pending(self) -> tuple[int, int] | None:
        return (self.lo, self.hi) if self.hi > self.lo else None

    def flush(self) -> None:
        """Send the pending range (one copy, asynchronous from pinned memory)."""
        if self.hi > self.lo:
            lo, hi = self.lo, self.hi
            self.dev[lo:hi].copy_(self.host[lo:hi], non_blocking=True)
            self.copies += 1
        self.lo, self.hi = self.host.numel(), 0


class _Buffer:
    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill: int = 0,
                 mirror: bool | None = None, arena: _Arena | None = None,
                 offset: int = 0) -> None:
        """``mirror``: separate device tensors (default: unless the device is the CPU).
        ``arena``: views at ``offset`` of the arena instead (its device side filled by the
        owner once every field's host side is)."""
        self._arena = arena
        if arena is not None:
            self.cpu, self.gpu = arena.view(offset, shape, dtype)
            self.cpu.fill_(fill)
            self._offset = offset
            self._row_bytes = self.cpu[0].numel() * self.cpu.element_size()
        else:
            pin = device.type == "cuda"
            self.cpu = torch.full(shape, fill, dtype=dtype, pin_memory=pin)
            if mirror is None:
                mirror = device.type != "cpu"
            self.gpu = torch.full(shape, fill, dtype=dtype, device=device) if mirror else self.cpu
        self.np: np.ndarray = self.cpu.numpy()

    def put(self, values) -> torch.Tensor:
        """Fill the first len(values) rows from a sequence and upload them (asynchronously
        from pinned memory: no wait for the device; packed: at the step's flush)."""
        n = len(values)
        self.np[:n] = values
        return self.upload(n)

    def upload(self, n: int) -> torch.Tensor:
        """Copy the first n rows to the device (packed: at the next flush); returns that
        device slice, to be read only after the flush in stream order."""
        if self._arena is not None:
            self._arena.touch(self._offset, self._offset + int(n) * self._row_bytes)
        elif self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


# Arena order: the big per-token fields first (a step that writes them spans them anyway),
# then the fields some steps write, then what every decode step writes, the persistent
# block table last (its rows [0, dirty) are a prefix: the range ends right after them).
_TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping")


def field_specs(max_tokens: int, max_reqs: int, max_blocks: int, decode_rows: bool):
    """(name, shape, dtype, fill) of the arena's fields, in arena order."""
    T, R = max_tokens, max_reqs
    i64, i32, f32 = torch.int64, torch.int32, torch.float32
    specs = [("input_ids", (T,), i64, 0), ("positions", (T,), i64, 0),
             ("slot_mapping", (T,), i64, -1),
             ("logits_indices", (R,), i64, 0),
             ("temperature", (R,), f32, 0), ("top_k", (R,), i64, 0), ("top_p", (R,), f32, 0),
             ("min_p", (R,), f32, 0),
             ("fix_dst", (R,), i64, 0), ("fix_src", (R,), i64, 0)]
    if decode_rows:
        specs += [("decode_input_ids", (R,), i64, 0), ("decode_positions", (R,), i64, 0),
                  ("decode_slot_mapping", (R,), i64, -1)]
    specs += [("query_start_loc", (R + 1,), i32, 0), ("seq_lens", (R,), i32, 0),
              ("table_slots", (R,), i64, 0), ("req_tables", (R + 1, max_blocks), i32, 0)]
    return specs


class InputBuffers:
    def __init__(self, max_tokens: int, max_reqs: int, max_blocks: int,
                 device: torch.device, packed: bool | None = None,
                 mirror: bool | None = None) -> None:
        """``packed``: one arena, one copy per step (default: OCTAVO_PACKED_INPUTS, when there
        are device copies at all). ``mirror``: device tensors apart from the host ones (default:
        unless the device is the CPU; forced on the CPU, tests simulate a device)."""
        if mirror is None:
            mirror = device.type != "cpu"
        if packed is None:
            packed = envs.packed_inputs()
        self.packed = packed = packed and mirror
        specs = field_specs(max_tokens, max_reqs, max_blocks, decode_rows=packed)
        self.arena: _Arena | None = None
        self.layout: dict[str, tuple[int, int]] = {}
        if packed:
            self.layout, nbytes = arena_layout([s[:3] for s in specs])
            self.arena = _Arena(nbytes, device)
        fields = {}
        for name, shape, dtype, fill in specs:
            fields[name] = _Buffer(shape, dtype, device, fill, mirror, self.arena,
                                   self.layout.get(name, (0, 0))[0])
        if self.arena is not None:  # the device side starts as the host side
            self.arena.dev.copy_(self.arena.host)
        self.query_start_loc = fields["query_start_loc"]
        self.seq_lens = fields["seq_lens"]
        # Per-step block tables, one row per batch row: gathered on the device from
        # req_tables, a persistent table with one row ("slot") per live request that the
        # host only appends new block ids to. Row max_reqs stays zero (padding rows).
        # Device-only (never uploaded): outside the arena.
        self.block_tables = _Buffer((max_reqs, max_blocks), torch.int32, device, 0, mirror)
        self.req_tables = fields["req_tables"]
        self.table_slots = fields["table_slots"]
        self.logits_indices = fields["logits_indices"]
        # Per-row sampling parameters (filled only on steps that need them).
        self.temperature = fields["temperature"]
        self.top_k = fields["top_k"]
        self.top_p = fields["top_p"]
        self.min_p = fields["min_p"]
        # Inputs that are the previous step's samples (asynchronous scheduling): batch
        # positions, and rows of the previous step's sampled-token tensor.
        self.fix_dst = fields["fix_dst"]
        self.fix_src = fields["fix_src"]
        # The per-token fields: max_tokens rows, and (packed) max_reqs rows for decode steps.
        self._token_rows = {False: tuple(fields[n] for n in _TOKEN_FIELDS)}
        self._token_rows[True] = (tuple(fields["decode_" + n] for n in _TOKEN_FIELDS)
                                  if packed else self._token_rows[False])
        self.input_ids, self.positions, self.slot_mapping = self._token_rows[False]
        self.max_tokens = max_tokens
        self.max_reqs = max_reqs
        self.max_blocks = max_blocks
        self.pad_slot = max_reqs
        self._free_slots = list(range(max_reqs - 1, -1, -1))
        self._dirty_slots = 0  # rows [0, _dirty_slots) of req_tables are uploaded per step
        self._gather_rows: int | None = None  # packed: block tables to gather at the flush

    def use_decode_rows(self, decode: bool) -> None:
        """Point input_ids / positions / slot_mapping at the decode set (one token per
        request, max_reqs rows) or the max_tokens-row set, for the step about to be written.
        The same set both ways when unpacked."""
        self.input_ids, self.positions, self.slot_mapping = self._token_rows[decode]

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
        filled by the host), and gather the batch's block tables on the device (packed: at
        the flush, after the copy)."""
        self.req_tables.upload(self._dirty_slots)
        slots = self.table_slots.upload(b)
        out = self.block_tables.gpu[:b]
        if self.arena is not None:
            self._gather_rows = b
        else:
            torch.index_select(self.req_tables.gpu, 0, slots, out=out)
        return out

    def pending_copy(self) -> tuple[int, int] | None:
        """Packed: the byte range the next flush sends (None: nothing, or unpacked)."""
        return self.arena.pending() if self.arena is not None else None

    def flush(self) -> None:
        """Send what the step uploaded (packed: one copy) and gather its block tables. Call
        once per step after its last upload, before anything reads a device field."""
        if self.arena is None:
            return
        self.arena.flush()
        b, self._gather_rows = self._gather_rows, None
        if b is not None:
            torch.index_select(self.req_tables.gpu, 0, self.table_slots.gpu[:b],
                               out=self.block_tables.gpu[:b])
