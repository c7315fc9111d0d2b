"""The core tests build no engine: skip the top-level leak check (nothing of theirs for it to
check: it looks at engines only); these tests check the block pool themselves."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_block_leaks():
    yield
