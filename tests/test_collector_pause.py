"""The garbage collector paused while a large request body is parsed
(octavo/entrypoints/openai/collector_pause.py): counted across threads, never turned on when
it was off, and off for a bounded stretch only."""

from __future__ import annotations

import gc

import pytest

from octavo.entrypoints.openai import collector_pause


def test_collector_pauses_are_counted():
    assert gc.isenabled()
    with collector_pause.collector_paused():
        assert not gc.isenabled()
        with collector_pause.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still runs
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off():
    gc.disable()
    try:
        with collector_pause.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_pauses_end_after_the_time_bound(monkeypatch):
    monkeypatch.setattr(collector_pause, "MAX_PAUSE_S", 0.0)
    first = collector_pause.collector_paused()
    first.__enter__()
    try:
        assert not gc.isenabled()
        with collector_pause.collector_paused():
            pass
        assert gc.isenabled()  # over the bound: on again though the first still runs
        with collector_pause.collector_paused():
            assert gc.isenabled()  # and no pause turns it off until none runs
    finally:
        first.__exit__(None, None, None)
    assert gc.isenabled()
    with collector_pause.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pause_ends_on_error():
    with pytest.raises(ValueError), collector_pause.collector_paused():
        raise ValueError("boom")
    assert gc.isenabled()
