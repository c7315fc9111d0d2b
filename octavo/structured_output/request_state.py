"""One request's grammar state: its matcher, advanced by each token the engine accepts."""

from __future__ import annotations

from typing import Any


class GrammarState:
    """Lives with the engine-side request state (not the worker's), so it follows the
    request's accepted output tokens: a preempted request keeps its tokens and its matcher,
    and the recompute that resumes it replays nothing here. Each sample of an n > 1 request
    has its own."""

    def __init__(self, backend: Any, matcher: Any) -> None:
        self.backend = backend
        self.matcher = matcher
        self.num_accepted = 0

    @property
    def is_terminated(self) -> bool:
        """The grammar ended and its stop token (EOS) was accepted."""
        return self.matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it. Past the
        grammar's end (a request with ignore_eos going on after EOS) nothing is checked."""
        if self.matcher.is_terminated():
            return True
        if not self.matcher.accept_token(token_id):
            return False
        self.num_accepted += 1
        return True


def conflict(params: Any, num_output_tokens: int) -> tuple[str, str]:
    """(message, field) for a request whose grammar allowed none of the tokens its other
    constraints left after ``num_output_tokens`` tokens: the client's fields conflict (a
    choice already complete while ``min_tokens`` forbids ending, ``allowed_token_ids``
    outside the grammar's language). The field named is the first of those set."""
    causes: list[tuple[str, str]] = []
    if params.min_tokens > num_output_tokens:
        causes.append(("min_tokens", f"min_tokens={params.min_tokens} forbids ending before "
                       f"{params.min_tokens} tokens"))
    if params.allowed_token_ids:
        ids = params.allowed_token_ids
        shown = ids[:8] + (["..."] if len(ids) > 8 else [])
        causes.append(("allowed_token_ids", f"allowed_token_ids allows only "
                       f"{len(ids)} token(s) {shown}"))
    if params.bad_words:
        causes.append(("bad_words", f"bad_words forbids {len(params.bad_words)} word(s)"))
    what = "; ".join(text for _, text in causes) or "no other constraint was found"
    field = causes[0][0] if causes else "structured_outputs"
    return (f"after {num_output_tokens} output token(s) the structured output grammar allows "
            f"no token that the request's other constraints allow ({what})", field)
