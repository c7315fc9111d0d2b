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
