"""A sequence's logprobs (sampled or prompt) kept in a few flat lists instead of one dict of
``Logprob`` objects per position.

Why: W1 with ``logprobs=5`` holds 134k positions of 6 entries each until ``generate`` returns.
As dicts of ``Logprob`` objects that is ~940k objects the cyclic garbage collector tracks, and
each of its full collections walks them all: on this 2-core CPU (tiny-qwen3 W1) seven full
collections took 1.59 s, the longest 0.48 s with every request of the batch waiting (on an
H100, steps of 290-640 ms; W1 ran at 68% of plain). Lists of ints, floats and strings are a
handful of tracked objects per sequence, whatever its length.

It reads like ``list[dict[int, Logprob] | None]`` (indexing, slicing, iteration, ``len``,
equality with such a list, ``+``): each position's dict is built when it is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat

from octavo.outputs import Logprob


class FlatLogprobs(Sequence):
    """Positions one after another: position i holds entries ``bounds[i]:bounds[i + 1]`` of
    ``token_ids`` / ``logprobs`` / ``ranks`` / ``decoded``, in the order its dict lists them;
    positions in ``nones`` are None (a prompt's first position)."""

    __slots__ = ("bounds", "token_ids", "logprobs", "ranks", "decoded", "nones")

    def __init__(self, entries: Iterable[dict[int, Logprob] | None] = ()) -> None:
        self.bounds: list[int] = [0]
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.ranks: list[int | None] = []
        self.decoded: list[str | None] = []
        self.nones: set[int] = set()
        for entry in entries:
            self.append(entry)

    # --- building ---------------------------------------------------------------------

    def append(self, entry: dict[int, Logprob] | None) -> None:
        """One position, as the dict it reads back as (or None)."""
        if entry is None:
            self.nones.add(len(self.bounds) - 1)
        else:
            for tid, lp in entry.items():
                self._add(tid, lp.logprob, lp.rank, lp.decoded_token)
        self.bounds.append(len(self.token_ids))

    def append_position(self, token: int, logprob: float, rank: int | None,
                        top_ids: Sequence[int], top_logprobs: Sequence[float],
                        decode=None) -> None:
        """One position: the top entries (ranks 1, 2, ...), then the chosen ``token`` with its
        own logprob and rank, which replaces its top entry where it is one of them (a dict
        built the same way keeps it there). ``decode``: id -> its token string, or None."""
        k = len(top_ids)
        start = len(self.token_ids)
        self.token_ids += top_ids
        self.logprobs += top_logprobs
        self.ranks += range(1, k + 1)
        self.decoded += map(decode, top_ids) if decode else repeat(None, k)
        if token in top_ids:
            at = start + list(top_ids).index(token)
            self.logprobs[at], self.ranks[at] = logprob, rank
        else:
            self._add(token, logprob, rank, decode(token) if decode else None)
        self.bounds.append(len(self.token_ids))

    def _add(self, tid: int, logprob: float, rank: int | None, decoded: str | None) -> None:
        self.token_ids.append(tid)
        self.logprobs.append(logprob)
        self.ranks.append(rank)
        self.decoded.append(decoded)

    def extend(self, other: Iterable[dict[int, Logprob] | None]) -> None:
        if isinstance(other, FlatLogprobs):
            base, n = len(self.token_ids), len(self)
            self.nones.update(n + i for i in other.nones)
            self.token_ids += other.token_ids
            self.logprobs += other.logprobs
            self.ranks += other.ranks
            self.decoded += other.decoded
            self.bounds += [base + b for b in other.bounds[1:]]
            return
        for entry in other:
            self.append(entry)

    # --- reading ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def _entry(self, i: int) -> dict[int, Logprob] | None:
        if i in self.nones:
            return None
        lo, hi = self.bounds[i], self.bounds[i + 1]
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded[j])
                for j in range(lo, hi)}

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return FlatLogprobs(self._entry(i) for i in range(start, stop, step))
            return self._span(start, max(start, stop))
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("FlatLogprobs index out of range")
        return self._entry(i)

    def _span(self, start: int, stop: int) -> FlatLogprobs:
        out = FlatLogprobs()
        lo, hi = self.bounds[start], self.bounds[stop]
        out.token_ids = self.token_ids[lo:hi]
        out.logprobs = self.logprobs[lo:hi]
        out.ranks = self.ranks[lo:hi]
        out.decoded = self.decoded[lo:hi]
        out.bounds = [b - lo for b in self.bounds[start:stop + 1]]
        out.nones = {i - start for i in self.nones if start <= i < stop}
        return out

    def __iter__(self) -> Iterator[dict[int, Logprob] | None]:
        for i in range(len(self)):
            yield self._entry(i)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (FlatLogprobs, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable, as the list it stands for

    def __add__(self, other) -> FlatLogprobs:
        out = self[:]
        out.extend(other)
        return out

    def __radd__(self, other) -> FlatLogprobs:
        out = FlatLogprobs(other)
        out.extend(self)
        return out

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self):  # the flat lists themselves: small and fast to pickle
        return (_rebuild, (self.bounds, self.token_ids, self.logprobs, self.ranks, self.decoded,
                           sorted(self.nones)))


def _rebuild(bounds, token_ids, logprobs, ranks, decoded, nones) -> FlatLogprobs:
    out = FlatLogprobs()
    out.bounds, out.token_ids, out.logprobs = bounds, token_ids, logprobs
    out.ranks, out.decoded, out.nones = ranks, decoded, set(nones)
    return out
