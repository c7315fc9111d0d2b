"""Which replica gets a request: the least loaded (fewest requests in flight), ties broken
round robin, with a cheap prefix affinity.

Affinity: a prompt's first KV block of token ids (``block_size`` tokens) is remembered with the
replica it went to (a bounded LRU map); the next prompt that starts with the same block goes to
that replica again while it carries at most ``PREFIX_SLACK`` more requests than the least
loaded, so prompts sharing a system prompt or a few-shot header tend to hit one replica's
prefix cache, and the load still never drifts by more than the slack. Pure Python, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX_SLACK = 4
MAX_PREFIXES = 4096


def prefix_key(prompt: Any, block_size: int) -> int | None:
    """A hash of the prompt's first full block of token ids; None without one (text prompts
    the router did not tokenize, prompts shorter than a block)."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, Mapping) else prompt
    if not isinstance(ids, Sequence) or isinstance(ids, str) or len(ids) < block_size:
        return None
    return hash(tuple(ids[:block_size]))


class RoutingPolicy:
    """Not thread-safe: the router calls ``pick`` under its lock."""

    def __init__(self, slack: int = PREFIX_SLACK, max_prefixes: int = MAX_PREFIXES) -> None:
        self.slack = slack
        self.max_prefixes = max_prefixes
        self._next = 0  # round robin among the least loaded
        self._prefixes: OrderedDict[int, int] = OrderedDict()

    def pick(self, loads: Mapping[int, int], key: int | None = None) -> int | None:
        """The replica index for a request, given the in-flight count of every ready replica
        (None: no replica is ready)."""
        if not loads:
            return None
        low = min(loads.values())
        if key is not None:
            sticky = self._prefixes.get(key)
            if sticky in loads and loads[sticky] <= low + self.slack:
                self._prefixes.move_to_end(key)
                return sticky
        ready = sorted(loads)
        start = self._next % len(ready)
        order = ready[start:] + ready[:start]
        choice = next(i for i in order if loads[i] == low)
        self._next = ready.index(choice) + 1
        if key is not None:
            self._prefixes[key] = choice
            self._prefixes.move_to_end(key)
            while len(self._prefixes) > self.max_prefixes:
                self._prefixes.popitem(last=False)
        return choice
