"""The distinct tokens of a growing sequence and how often each occurs, kept up to date a step
at a time, in numpy buffers so that a step's batch of requests concatenates them in C (the
penalties are applied to every request's seen tokens in one gather and one scatter); and a
read-only view of part of a token list that copies nothing until sliced."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class TokenSpan(Sequence):
    """``seq[start:end]`` without the copy: the worker's token list is prompt then output,
    and a step needs only a few of its tokens (the new ones, a bad word's prefix). With
    ``end`` None the span runs to the list's end as it is when read: a step whose sampling
    waits for the step before (``defer_sampling``) sees the token that step appended."""

    __slots__ = ("seq", "start", "_end")

    def __init__(self, seq: list[int], start: int = 0, end: int | None = None) -> None:
        self.seq = seq
        self.start = start
        self._end = end

    @property
    def end(self) -> int:
        return len(self.seq) if self._end is None else self._end

    @property
    def open(self) -> bool:
        return self._end is None

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, index):
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            return self.seq[self.start + lo: self.start + hi: step]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("TokenSpan index out of range")
        return self.seq[self.start + index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.seq[self.start: self.end])

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"TokenSpan({list(self)!r})"


class TokenTally:
    """Distinct token ids of a sequence in first-seen order (``ids[:n]``) with their counts
    (``counts[:n]``), fed the sequence each step: only tokens past those already counted are
    added; a sequence shorter than what was counted starts the tally over."""

    def __init__(self) -> None:
        self.pos: dict[int, int] = {}
        self.ids = np.empty(16, dtype=np.int64)
        self.counts = np.empty(16, dtype=np.float32)
        self.n = 0
        self.upto = 0  # tokens of the sequence counted

    def update(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self.upto:
            self.__init__()
        new = tokens[self.upto:]
        self.upto = len(tokens)
        if self.n == 0 and len(new) > 1024:  # a prompt: counted in C, not token by token
            uniq, counts = np.unique(np.asarray(new, dtype=np.int64), return_counts=True)
            self.ids, self.counts, self.n = uniq, counts.astype(np.float32), len(uniq)
            self.pos = dict(zip(uniq.tolist(), range(len(uniq))))
            return
        pos, ids, counts = self.pos, self.ids, self.counts
        for t in new:
            i = pos.get(t)
            if i is not None:
                counts[i] += 1.0
                continue
            if self.n == len(ids):
                ids = self.ids = np.concatenate([ids, np.empty_like(ids)])
                counts = self.counts = np.concatenate([counts, np.empty_like(counts)])
            pos[t] = self.n
            ids[self.n] = t
            counts[self.n] = 1.0
            self.n += 1
