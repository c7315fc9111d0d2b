"""Per-request logits processing before sampling: repetition / frequency / presence
penalties, logit_bias, allowed_token_ids, bad_words and min_tokens bans.

Applied to the raw logits (before temperature), in that order, only to the rows that ask for
it; the other rows cost nothing. A step's rows are processed together. Where the worker keeps
``PenaltyRows`` (on CUDA, and under asynchronous scheduling) the penalties come from token
counts on the device, counted as tokens are sampled: a step sends only the rows' indices and
parameters. Elsewhere (the CPU, synchronous) they touch only the tokens a request has seen
(its prompt and output, kept as a ``TokenTally`` updated with each step's new tokens), every
penalized row's tokens read in one gather and written in one scatter. logit_bias entries and
bans are applied the same way. What a request needs every step from its fixed fields (the
allowed-token mask, the logit_bias tensors, the tallies or its penalty row) is built once and
kept in its ``RowCache``. User logits processors run per row, as written.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from octavo.sample.penalty_rows import PenaltyRow, PenaltyRows
from octavo.sample.token_tally import TokenSpan, TokenTally
from octavo.sample.upload import to_device
from octavo.sampling_params import SamplingParams


@dataclass
class RowCache:
    """One request's processing state, kept across steps by the worker's request state."""

    allowed: torch.Tensor | None = None  # 0 at allowed_token_ids, -inf elsewhere
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # logit_bias ids and values
    seen: TokenTally | None = None  # the prompt and output so far (repetition penalty)
    output: TokenTally | None = None  # the output so far (frequency / presence penalties)
    penalty: PenaltyRow | None = None  # its row of the worker's PenaltyRows, where it has one


@dataclass
class RowContext:
    row: int
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    bad_words_token_ids: list[list[int]] | BadWordIndex | None = None
    banned: list[int] | None = None  # e.g. EOS while short of min_tokens
    cache: RowCache | None = None  # None: everything built for this step only

    @classmethod
    def over(cls, row: int, params: SamplingParams, token_ids: list[int], num_prompt: int,
             bad_words_token_ids: BadWordIndex | None = None, banned: list[int] | None = None,
             cache: RowCache | None = None) -> RowContext:
        """A row whose prompt and output are views of one list (prompt then output: the
        worker's), copied only where a step needs them; the output runs to the list's end
        when read (a deferred sampling sees the token the step before appended)."""
        return cls(row, params, TokenSpan(token_ids, 0, num_prompt),
                   TokenSpan(token_ids, num_prompt), bad_words_token_ids, banned, cache)

    def all_token_ids(self) -> Sequence[int]:
        """The prompt then the output."""
        p, o = self.prompt_token_ids, self.output_token_ids
        if isinstance(p, TokenSpan) and isinstance(o, TokenSpan) and p.seq is o.seq \
                and p.end == o.start:
            return TokenSpan(p.seq, p.start, None if o.open else o.end)
        return list(p) + list(o)


def needs_processing(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0 or bool(params.logit_bias)
            or params.allowed_token_ids is not None or bool(params.bad_words)
            or bool(params.logits_processors))


class BadWordIndex:
    """A request's bad words (token sequences) indexed by prefix: a step's bans cost one dict
    lookup per distinct word length, not a comparison per word (a request may send 100k
    words, and every step of the batch would wait on the scan)."""

    def __init__(self, words: list[list[int]]) -> None:
        self.always = sorted({w[0] for w in words if len(w) == 1})
        # prefix length -> prefix -> the last tokens of the words that start with it
        self.by_prefix: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for w in words:
            if len(w) > 1:
                table = self.by_prefix.setdefault(len(w) - 1, {})
                table.setdefault(tuple(w[:-1]), []).append(w[-1])

    def bans(self, output: list[int]) -> list[int]:
        """Last tokens of bad words whose prefix the output currently ends with."""
        out = list(self.always)
        for n, table in self.by_prefix.items():
            if n <= len(output):
                out += table.get(tuple(output[-n:]), ())
        return out


def _bad_word_bans(output: list[int], bad_words: list[list[int]] | BadWordIndex) -> list[int]:
    """Last tokens of bad words whose prefix the output currently ends with."""
    index = bad_words if isinstance(bad_words, BadWordIndex) else BadWordIndex(bad_words)
    return index.bans(output)


class _Step:
    """What a step's rows ask for, gathered per row, then applied to the batch at once."""

    def __init__(self, pool: PenaltyRows | None) -> None:
        self.pool = pool
        self.pooled: list[tuple[int, PenaltyRow, Sequence[int], float, float, float]] = []
        self.rep: list[tuple[int, TokenTally, float]] = []
        self.freq: list[tuple[int, TokenTally, float, float]] = []
        self.bias: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.allowed: list[tuple[int, torch.Tensor]] = []
        self.user: list[RowContext] = []
        self.bans: list[tuple[int, list[int]]] = []

    def add(self, ctx: RowContext, vocab: int, dev: torch.device) -> None:
        p = ctx.params
        cache = ctx.cache if ctx.cache is not None else RowCache()
        penalized = (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
                     or p.presence_penalty != 0.0)
        if penalized and self.pool is not None and ctx.cache is not None:
            if cache.penalty is None:
                cache.penalty = self.pool.acquire(ctx.prompt_token_ids, ctx.output_token_ids,
                                                  vocab, dev)
            self.pooled.append((ctx.row, cache.penalty, ctx.output_token_ids,
                                p.repetition_penalty, p.frequency_penalty, p.presence_penalty))
            penalized = False  # counted on the device, not in the host tallies below
        if penalized and p.repetition_penalty != 1.0:
            cache.seen = cache.seen or TokenTally()
            cache.seen.update(ctx.all_token_ids())
            self.rep.append((ctx.row, cache.seen, p.repetition_penalty))
        if penalized and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0):
            cache.output = cache.output or TokenTally()
            cache.output.update(ctx.output_token_ids)
            self.freq.append((ctx.row, cache.output, p.frequency_penalty, p.presence_penalty))
        if p.logit_bias:
            if cache.bias is None:
                cache.bias = (to_device([t for t in p.logit_bias if t < vocab], dev,
                                        torch.long),
                              to_device([v for t, v in p.logit_bias.items() if t < vocab],
                                        dev, torch.float32))
            self.bias.append((ctx.row, *cache.bias))
        if p.allowed_token_ids is not None:
            if cache.allowed is None:
                keep = torch.full((vocab,), float("-inf"), dtype=torch.float32, device=dev)
                # index_fill_ takes the value as a number; an indexed assignment sends it
                # as a pageable one-element tensor, a stream synchronization.
                keep.index_fill_(0, to_device(p.allowed_token_ids, dev, torch.long), 0.0)
                cache.allowed = keep
            self.allowed.append((ctx.row, cache.allowed))
        if p.logits_processors:
            self.user.append(ctx)
        bans = list(ctx.banned or [])
        if ctx.bad_words_token_ids:
            bans += _bad_word_bans(ctx.output_token_ids, ctx.bad_words_token_ids)
        if bans:
            self.bans.append((ctx.row, bans))


def _entries(tallies: list, vocab: int, dev: torch.device, *per_row: list[float]
             ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(flat indices ``row * vocab + token`` into the logits, counts, each per-row value
    repeated per token) of the tallies' distinct tokens, concatenated on the host and sent to
    ``dev`` in one queued copy each."""
    lens = np.array([t.n for _, t, *_ in tallies], dtype=np.int64)
    rows = np.repeat(np.array([r for r, *_ in tallies], dtype=np.int64) * vocab, lens)
    ids = np.concatenate([t.ids[:t.n] for _, t, *_ in tallies])
    counts = np.concatenate([t.counts[:t.n] for _, t, *_ in tallies])
    values = [np.repeat(np.array(v, dtype=np.float32), lens) for v in per_row]
    if ids.size and ids.max() >= vocab:  # past the logits' width: no logit to change there
        keep = ids < vocab
        rows, ids, counts = rows[keep], ids[keep], counts[keep]
        values = [v[keep] for v in values]
    return (to_device(rows + ids, dev), to_device(counts, dev),
            [to_device(v, dev) for v in values])


def apply_logits_processors(logits: torch.Tensor, rows: list[RowContext],
                            failed: dict[int, BaseException] | None = None,
                            penalties: PenaltyRows | None = None) -> torch.Tensor:
    """logits [B, V] (float32) -> processed logits (in place where ``logits`` is contiguous);
    rows not listed are left as they are.

    With ``penalties``, the penalties of rows with a ``cache`` come from that pool's counts
    (a row taken on first use, kept in the cache), and the caller counts the sampled tokens
    with ``penalties.count_sampled``; without, from host tallies of the rows' token lists.

    With ``failed``, an exception while preparing one row or in its user logits processor is
    recorded there under the row, whose result is then not to be used (its request ends with
    the error), so one request's fault never stops the batch; without it, the exception
    propagates."""
    vocab, dev = logits.shape[-1], logits.device
    logits = logits.contiguous()  # (indexed flat: row * vocab + token)
    flat = logits.view(-1)
    if penalties is not None:
        penalties.new_step()
    step = _Step(penalties)
    for ctx in rows:
        try:
            step.add(ctx, vocab, dev)
        except Exception as e:  # noqa: BLE001 - attributed to this row's request
            if failed is None:
                raise
            failed[ctx.row] = e
    if step.pooled:
        penalties.apply(logits, step.pooled)
    if step.rep:  # transformers' rule: positive logits divided by the penalty, others times
        at, _, (pen,) = _entries(step.rep, vocab, dev, [p for *_, p in step.rep])
        v = flat.index_select(0, at)
        flat.index_copy_(0, at, torch.where(v > 0, v / pen, v * pen))
    if step.freq:  # OpenAI's: logit -= count * frequency + (count > 0) * presence
        at, n, (f, pres) = _entries(step.freq, vocab, dev, [f for *_, f, _ in step.freq],
                                    [p for *_, p in step.freq])
        flat.index_copy_(0, at, flat.index_select(0, at) - n * f - pres)
    if step.bias:
        r = torch.cat([torch.full_like(ids, row) for row, ids, _ in step.bias])
        logits.index_put_((r, torch.cat([ids for _, ids, _ in step.bias])),
                          torch.cat([b for *_, b in step.bias]), accumulate=True)
    for row, mask in step.allowed:
        logits[row] += mask
    for ctx in step.user:
        try:
            row = logits[ctx.row]
            for fn in ctx.params.logits_processors:
                row = _user_processor(fn, ctx, row)
            logits[ctx.row] = row
        except Exception as e:  # noqa: BLE001 - attributed to this row's request
            if failed is None:
                raise
            failed[ctx.row] = e
    flat_bans = [row * vocab + t for row, b in step.bans for t in b if t < vocab]
    if flat_bans:
        flat.index_fill_(0, to_device(flat_bans, dev, torch.long), float("-inf"))
    return logits


def _user_processor(fn, ctx: RowContext, row: torch.Tensor) -> torch.Tensor:
    """vLLM's two signatures: (output_ids, logits) or (prompt_ids, output_ids, logits)."""
    try:
        three = len(inspect.signature(fn).parameters) == 3
    except (TypeError, ValueError):  # builtins without a signature: the common form
        three = False
    try:
        out = (fn(list(ctx.prompt_token_ids), list(ctx.output_token_ids), row) if three
               else fn(list(ctx.output_token_ids), row))
    except Exception:
        raise
    except BaseException as e:
        # SystemExit, GeneratorExit, CancelledError... from user code. Raised as they are,
        # they killed the engine thread, and every request of a server with it; as an
        # Exception this request alone ends. Only KeyboardInterrupt on the main thread goes
        # on as it is: there it may be Ctrl-C (signals reach only the main thread), which
        # must still stop the caller (the engine drops its requests on the way out).
        if isinstance(e, KeyboardInterrupt) and threading.current_thread() is \
                threading.main_thread():
            raise
        raise RuntimeError(f"logits processor {fn!r} raised {e!r}") from e
    if not isinstance(out, torch.Tensor) or out.shape != row.shape:
        raise ValueError(f"logits processor {fn!r} must return a tensor of shape "
                         f"{tuple(row.shape)}, got {type(out).__name__}"
                         f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}")
    return out.to(row.dtype)
