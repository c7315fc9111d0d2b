"""Repetition, frequency and presence penalties from token counts kept where the logits are.

Each penalized request holds a row of two [rows, vocab] tensors: how often each token is in
its output (int32) and whether it is in its prompt (bool). A row is filled once from the
request's token lists when it first samples; after that the sampler counts each sampled token
on the device (``count_sampled``), so a step's penalties need nothing from the host but the
rows' indices and parameters. The host's token lists may then lag the device (asynchronous
scheduling launches a step before the one before it is read back): a row counts the tokens
the device sampled for it, and takes from the host list only tokens past that count (a caller
that appends tokens itself, as the tests do).

Why: with the tallies on the host, a step copied every penalized row's distinct tokens to the
device (about 6 MB at 256 rows) and updated the tallies in Python, ~4 ms of host work a step
at W1's 130 rows that the device waited for (W1 with penalties 17.9k output tok/s against
19.9k plain on an H100, session 49); and the request's sampling had to wait for its history
to reach the host. Memory: 5 bytes per vocabulary entry per penalized request in flight
(195 MB for 256 requests at a 152k vocabulary), allocated as penalized requests arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from octavo.kernels.triton_available import HAS_TRITON
from octavo.sample.upload import to_device


@dataclass
class PenaltyRow:
    index: int  # the row of PenaltyRows' tensors
    counted: int  # output tokens counted in it (host-given and device-sampled)


class PenaltyRows:
    """The rows of the penalized requests in flight, grown as they arrive."""

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = max_rows  # the most requests in flight (max_num_seqs): growth stops there
        self.counts: torch.Tensor | None = None  # [rows, vocab] int32: output counts
        self.prompt: torch.Tensor | None = None  # [rows, vocab] uint8: 1 where in the prompt
        self.free: list[int] = []
        self._step: tuple[torch.Tensor, torch.Tensor, list[PenaltyRow]] | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.counts is None else self.counts.shape[0]

    def _grow(self, vocab: int, device: torch.device) -> None:
        # With a known bound, every row at once: the KV-cache profile sized the cache with a
        # full batch's rows in its peak (``profile_sampler``), and each growth allocates and
        # copies [rows, vocab] x 5 bytes (up to ~200 MB at 256 x 152k) inside a step.
        old = self.capacity
        n = max(8, 2 * old) if self.max_rows is None else max(old + 1, self.max_rows)
        counts = torch.zeros((n, vocab), dtype=torch.int32, device=device)
        prompt = torch.zeros((n, vocab), dtype=torch.uint8, device=device)
        if self.counts is not None:
            counts[:old] = self.counts
            prompt[:old] = self.prompt
        self.counts, self.prompt = counts, prompt
        self.free += range(n - 1, old - 1, -1)

    def acquire(self, prompt_ids: Sequence[int], output_ids: Sequence[int], vocab: int,
                device: torch.device) -> PenaltyRow:
        """A zeroed row holding ``prompt_ids``' marks and ``output_ids``' counts (ids at or
        past ``vocab``, the logits' width, have no logit and are left out)."""
        if self.counts is not None and self.counts.shape[1] != vocab:
            raise ValueError(f"penalty rows hold {self.counts.shape[1]} logits a row, "
                             f"a step has {vocab}")
        if not self.free:
            self._grow(vocab, device)
        row = PenaltyRow(self.free.pop(), 0)
        self.counts[row.index].zero_()
        self.prompt[row.index].zero_()
        ids = [t for t in prompt_ids if t < vocab]
        if ids:
            self.prompt[row.index].index_fill_(0, to_device(ids, device, torch.long), 1)
        self._add(device, [(row, output_ids)])
        return row

    def release(self, row: PenaltyRow) -> None:
        self.free.append(row.index)

    def _add(self, device: torch.device, rows: list[tuple[PenaltyRow, Sequence[int]]]) -> None:
        """Count the tokens of each row's host list past what the row has counted."""
        flat: list[int] = []
        vocab = self.counts.shape[1]
        for row, output in rows:
            if len(output) > row.counted:
                base = row.index * vocab
                flat += [base + t for t in output[row.counted:] if t < vocab]
                row.counted = len(output)
        if flat:
            at = to_device(flat, device, torch.long)
            self.counts.view(-1).index_add_(0, at, torch.ones_like(at, dtype=torch.int32))

    def apply(self, logits: torch.Tensor,
              entries: list[tuple[int, PenaltyRow, Sequence[int], float, float, float]]
              ) -> None:
        """Penalize ``logits`` [B, V] in place; an entry is (logits row, penalty row, the
        request's output on the host, repetition, frequency, presence). transformers' rule
        first (positive logits of prompt or output tokens divided by the penalty, others
        times it), then OpenAI's (logit -= count * frequency + (count > 0) * presence).
        Remembers the rows for ``count_sampled``."""
        dev = logits.device
        self._add(dev, [(row, output) for _, row, output, *_ in entries])
        at = to_device([r for r, *_ in entries], dev, torch.long)
        rows = to_device([row.index for _, row, *_ in entries], dev, torch.long)
        # One upload for the three parameters: [3, R] float32, R padded to a multiple of 4
        # so each row starts 16-byte aligned (Triton specializes a pointer argument on that:
        # an unaligned row would compile the kernel again, a stall of the whole step).
        pad = [0.0] * (-len(entries) % 4)
        params = to_device([[e[3] for e in entries] + pad, [e[4] for e in entries] + pad,
                            [e[5] for e in entries] + pad], dev, torch.float32)
        n = len(entries)
        args = (logits, at, rows, self.counts, self.prompt, params[0, :n], params[1, :n],
                params[2, :n])
        if logits.is_cuda and HAS_TRITON and logits.dtype == torch.float32 \
                and logits.stride(1) == 1:
            from octavo.kernels.penalties import apply_penalties  # Triton: on CUDA only

            apply_penalties(*args)
        else:
            penalize(*args)
        self._step = (at, rows, [row for _, row, *_ in entries])

    def new_step(self) -> None:
        """Forget the last ``apply``'s rows (a step whose sampling never came)."""
        self._step = None

    def count_sampled(self, sampled: torch.Tensor) -> None:
        """Count the tokens just sampled (``sampled`` [B], on the device) in the rows of the
        last ``apply``: the next step's penalties see them without the host."""
        step, self._step = self._step, None
        if step is None:
            return
        at, rows, held = step
        vocab = self.counts.shape[1]
        flat = rows * vocab + sampled.index_select(0, at).to(torch.long)
        self.counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        for row in held:
            row.counted += 1


def penalize(logits: torch.Tensor, at: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor,
             prompt: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor,
             pres: torch.Tensor) -> None:
    """Penalize ``logits`` [B, V] in place: row ``at[i]`` with the counts and prompt marks of
    row ``rows[i]`` of ``counts`` [N, V] int32 / ``prompt`` [N, V] uint8 and that row's
    ``rep`` / ``freq`` / ``pres`` [R] (torch; on CUDA ``octavo.kernels.penalties`` does it
    in one pass)."""
    c = counts.index_select(0, rows)
    present = c > 0
    x = logits.index_select(0, at)
    seen = prompt.index_select(0, rows).bool() | present
    x = torch.where(seen, torch.where(x > 0, x / rep[:, None], x * rep[:, None]), x)
    x = x - c.to(x.dtype) * freq[:, None]
    x = x - present.to(x.dtype) * pres[:, None]
    logits.index_copy_(0, at, x)
