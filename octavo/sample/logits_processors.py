"""Per-request logits processing before sampling: repetition / frequency / presence
penalties, logit_bias, allowed_token_ids, bad_words and min_tokens bans.

Applied to the raw logits (before temperature), in that order, only to the rows that ask for
it; the other rows cost nothing. What a request's processing needs every step from its
fixed fields (the allowed-token mask, the logit_bias tensors, the set of tokens seen so far for
the repetition penalty) is built once and kept in its ``RowCache``: rebuilt each step, a
vocabulary-sized ``logit_bias`` cost ~8 ms, a 128k-token prompt's repetition mask ~6 ms, per
request per step, and a batch of such requests stalled every other request with them.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

import torch

from octavo.sampling_params import SamplingParams


@dataclass
class RowCache:
    """One request's tensors, kept across steps by the worker's request state."""

    allowed: torch.Tensor | None = None  # 0 at allowed_token_ids, -inf elsewhere
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # logit_bias ids and values
    seen: torch.Tensor | None = None  # bool [vocab]: in the prompt or the output so far
    seen_upto: int = 0  # how many of prompt + output tokens ``seen`` holds


@dataclass
class RowContext:
    row: int
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    bad_words_token_ids: list[list[int]] | BadWordIndex | None = None
    banned: list[int] | None = None  # e.g. EOS while short of min_tokens
    cache: RowCache | None = None  # None: everything built for this step only


def needs_processing(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0 or bool(params.logit_bias)
            or params.allowed_token_ids is not None or bool(params.bad_words)
            or bool(params.logits_processors))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor,
                             penalty: float) -> torch.Tensor:
    """transformers' rule over prompt + output tokens: positive logits divided by the penalty,
    negative ones multiplied."""
    picked = logits[seen]
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def apply_frequency_presence(logits: torch.Tensor, counts: torch.Tensor, frequency: float,
                             presence: float) -> torch.Tensor:
    """OpenAI's rule over generated tokens: logit -= count * frequency + (count > 0) * presence."""
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


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


def apply_logits_processors(logits: torch.Tensor, rows: list[RowContext],
                            failed: dict[int, BaseException] | None = None) -> torch.Tensor:
    """logits [B, V] (float32) -> processed logits; rows not listed are left as they are.

    With ``failed``, an exception while processing one row (a user's logits processor, say)
    is recorded there under the row and that row keeps its raw logits, so one request's fault
    never stops the batch; without it, the exception propagates."""
    for ctx in rows:
        if failed is None:
            logits[ctx.row] = _process_row(logits[ctx.row], ctx)
            continue
        try:
            logits[ctx.row] = _process_row(logits[ctx.row], ctx)
        except Exception as e:  # noqa: BLE001 - attributed to this row's request
            failed[ctx.row] = e
    return logits


def _process_row(row: torch.Tensor, ctx: RowContext) -> torch.Tensor:
    vocab = row.shape[-1]
    dev = row.device
    p = ctx.params
    cache = ctx.cache if ctx.cache is not None else RowCache()
    if p.repetition_penalty != 1.0:
        row = apply_repetition_penalty(row, _seen(ctx, cache, vocab, dev), p.repetition_penalty)
    if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) and ctx.output_token_ids:
        counts = torch.bincount(torch.tensor(ctx.output_token_ids, device=dev),
                                minlength=vocab)[:vocab].to(row.dtype)
        row = apply_frequency_presence(row, counts, p.frequency_penalty, p.presence_penalty)
    if p.logit_bias:
        if cache.bias is None:
            cache.bias = (torch.tensor([t for t in p.logit_bias if t < vocab], device=dev),
                          torch.tensor([v for t, v in p.logit_bias.items() if t < vocab],
                                       dtype=row.dtype, device=dev))
        ids, bias = cache.bias
        row = row.index_add(0, ids, bias) if ids.numel() else row
    if p.allowed_token_ids is not None:
        if cache.allowed is None:
            keep = torch.full((vocab,), float("-inf"), dtype=row.dtype, device=dev)
            keep[torch.tensor(p.allowed_token_ids, device=dev)] = 0.0
            cache.allowed = keep
        row = row + cache.allowed
    for fn in p.logits_processors or ():
        row = _user_processor(fn, ctx, row)
    bans = list(ctx.banned or [])
    if ctx.bad_words_token_ids:
        bans += _bad_word_bans(ctx.output_token_ids, ctx.bad_words_token_ids)
    if bans:
        row = row.index_fill(0, torch.tensor(bans, device=dev), float("-inf"))
    return row


def _seen(ctx: RowContext, cache: RowCache, vocab: int, dev: torch.device) -> torch.Tensor:
    """Which tokens the prompt and the output so far hold, as a bool [vocab] mask: marked
    once, then only each step's new tokens (rebuilt if the sequence got shorter)."""
    prompt, output = ctx.prompt_token_ids, ctx.output_token_ids
    total = len(prompt) + len(output)
    if cache.seen is None or cache.seen_upto > total:
        cache.seen = torch.zeros(vocab, dtype=torch.bool, device=dev)
        cache.seen_upto = 0
    done = cache.seen_upto
    if done < total:
        new = (prompt[done:] + output) if done < len(prompt) else output[done - len(prompt):]
        cache.seen[torch.tensor(new, dtype=torch.long, device=dev)] = True
        cache.seen_upto = total
    return cache.seen


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
