"""Which prompts the servers check on the event loop: token ids up to INLINE_MAX_IDS in all
(no round trip through the pool, which in a burst puts a handler behind every request queued
meanwhile); text (tokenized) and larger id lists on the pool, so a hostile prompt cannot hold
the loop."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from octavo.entrypoints.openai.serving_engine import INLINE_MAX_IDS, _inline  # noqa: E402


@pytest.mark.parametrize("prompts, inline", [
    ([[1, 2, 3]], True),
    ([[7] * INLINE_MAX_IDS], True),
    ([[7] * (INLINE_MAX_IDS // 2), [8] * (INLINE_MAX_IDS // 2)], True),
    ([[7] * (INLINE_MAX_IDS // 2), [8] * (INLINE_MAX_IDS // 2 + 1)], False),
    ([[7] * 10_000_000], False),
    (["hello"], False),
    ([[1, 2], "hello"], False),
    ([{"prompt_token_ids": [1, 2]}], False),
])
def test_what_is_checked_on_the_event_loop(prompts, inline):
    assert _inline(prompts) is inline
