"""The core tests build no engine: skip the top-level leak check (its gc.collect() costs
~0.2 s per test once torch is loaded); these tests check the block pool themselves."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_block_leaks():
    yield
