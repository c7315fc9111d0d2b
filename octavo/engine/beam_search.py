"""Beam search bookkeeping with Hugging Face transformers' semantics. Pure Python.

`BeamSearch` holds one prompt's live beams and its finished hypotheses. Each `advance` takes,
for every live beam, the log-probabilities of its best next tokens (what the engine reports
with ``logprobs=num_candidates``) and applies one step of transformers' ``_beam_search``:

* the ``K = max(2, 1 + number of finishing tokens) * width`` best continuations over all live
  beams, ranked by cumulative logprob, are the candidates (K, not ``width``, so that ``width``
  unfinished ones remain even if every beam's best token is EOS);
* the best ``width`` candidates that do not finish are the next live beams;
* a candidate finishes on a finishing token (EOS unless ignore_eos, stop token ids) or when
  it reaches ``max_tokens``; only finishing candidates ranked among the first ``width`` become
  hypotheses, scored ``cum_logprob / num_generated_tokens ** length_penalty`` (the count
  includes the EOS token, not the prompt), and the ``width`` best hypotheses are kept;
* the search ends at ``max_tokens``; with ``early_stopping=True`` as soon as ``width``
  hypotheses exist; otherwise when they exist and the best live beam can no longer beat the
  worst of them, assuming its score at the current length (``False``) or, for
  ``"never"`` with a positive length penalty, at ``max_tokens``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from octavo.outputs import Logprob


def beam_score(cum_logprob: float, num_tokens: int, length_penalty: float) -> float:
    """Length-penalised score of a sequence of ``num_tokens`` generated tokens. Any finite
    length_penalty is valid (vLLM's range): a length factor past the float range saturates
    (2 ** 1e38 raised OverflowError, 2 ** -1e30 is 0.0 and divided by zero) instead of
    failing the request."""
    try:
        factor = max(num_tokens, 1) ** length_penalty
    except OverflowError:
        factor = math.inf
    if factor == 0.0:
        return -math.inf if cum_logprob < 0 else 0.0
    if math.isinf(factor):
        return -math.inf if math.isinf(cum_logprob) else -0.0
    return cum_logprob / factor


@dataclass(frozen=True)
class BeamSearchConfig:
    width: int
    max_tokens: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Tokens that end a beam: EOS ids (unless ignore_eos) and stop token ids.
    finish_token_ids: frozenset[int] = frozenset()
    # Ids among finish_token_ids reported as stop_reason (stop_token_ids; EOS reports None).
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"beam width must be at least 1, got {self.width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    @property
    def num_candidates(self) -> int:
        """Continuations kept per step (transformers' ``beams_to_keep``); each live beam must
        report at least this many of its best next tokens."""
        return max(2, 1 + len(self.finish_token_ids)) * self.width


@dataclass
class Beam:
    tokens: list[int] = field(default_factory=list)  # generated tokens only
    cum_logprob: float = 0.0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    score: float = 0.0  # set when the beam becomes a finished hypothesis

    def extend(self, token: int, logprob: float, step: dict[int, Logprob]) -> Beam:
        return Beam(self.tokens + [token], self.cum_logprob + logprob, self.logprobs + [step])


class BeamSearch:
    """One prompt's search. Feed `advance` until `done`, then read `finished` (best first)."""

    def __init__(self, config: BeamSearchConfig) -> None:
        self.config = config
        self.running: list[Beam] = [Beam()]
        self.finished: list[Beam] = []
        self.num_generated = 0
        self.done = False

    def advance(self, steps: list[dict[int, Logprob]]) -> None:
        """One step: ``steps[i]`` maps candidate next tokens of ``running[i]`` to their
        logprobs (at least the ``num_candidates`` best)."""
        assert not self.done and len(steps) == len(self.running), (len(steps), self.running)
        cfg = self.config
        length = self.num_generated + 1
        at_limit = length >= cfg.max_tokens
        cands = [(beam.cum_logprob + lp.logprob, b, tok)
                 for b, (beam, step) in enumerate(zip(self.running, steps))
                 for tok, lp in step.items()]
        # Deterministic order for exact ties: beam index, then token id.
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        cands = cands[:cfg.num_candidates]

        running: list[Beam] = []
        for rank, (_, b, tok) in enumerate(cands):
            ends = at_limit or tok in cfg.finish_token_ids
            if not ends and len(running) < cfg.width:
                running.append(self._extend(b, tok, steps))
            elif ends and rank < cfg.width:
                beam = self._extend(b, tok, steps)
                beam.score = beam_score(beam.cum_logprob, length, cfg.length_penalty)
                self.finished.append(beam)
        # Stable sort: an older hypothesis wins an exact tie, as in transformers' merge.
        self.finished.sort(key=lambda beam: -beam.score)
        del self.finished[cfg.width:]
        self.running = running
        self.num_generated = length
        self.done = at_limit or not running or self._cannot_improve()

    def _extend(self, b: int, tok: int, steps: list[dict[int, Logprob]]) -> Beam:
        return self.running[b].extend(tok, steps[b][tok].logprob, steps[b])

    def _cannot_improve(self) -> bool:
        cfg = self.config
        if len(self.finished) < cfg.width:
            return False
        if cfg.early_stopping is True:
            return True
        lp = cfg.length_penalty
        length = (cfg.max_tokens if cfg.early_stopping == "never" and lp > 0.0
                  else self.num_generated)
        best_possible = beam_score(self.running[0].cum_logprob, length, lp)
        return not best_possible > min(beam.score for beam in self.finished)

    def finish_reason(self, beam: Beam) -> tuple[str, int | None]:
        """(finish_reason, stop_reason) of a finished beam, as the engine reports them."""
        last = beam.tokens[-1]
        if last in self.config.finish_token_ids:
            return "stop", (last if last in self.config.stop_token_ids else None)
        return "length", None
