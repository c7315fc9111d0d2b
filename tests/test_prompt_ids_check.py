"""The token-id check of a prompt (``Processor._tokenize``): the common case runs in C loops
(the ids' types, then their range), anything else falls to the per-id loop, which names the
first bad id. Both must accept and refuse exactly the same prompts."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from octavo.engine.processor import Processor
from octavo.errors import InvalidRequestError

VOCAB = 1000


def _processor() -> Processor:
    config = SimpleNamespace(hf_config=SimpleNamespace(vocab_size=VOCAB), eos_token_ids=[2],
                             max_logprobs=20, max_model_len=4096)
    return Processor(config, None)


class Small(enum.IntEnum):
    A = 5


@pytest.mark.parametrize("ids", [[0], [VOCAB - 1], list(range(VOCAB)), (3, 4, 5),
                                 [Small.A, 7]])
def test_token_ids_in_range_are_taken_as_they_are(ids):
    text, out = _processor()._tokenize({"prompt_token_ids": ids})
    assert text is None and out == list(ids)


@pytest.mark.parametrize("ids, shown", [
    ([1, 2, VOCAB], repr(VOCAB)), ([-1, 5], "-1"), ([5, True], "True"), ([False], "False"),
    ([1, 2.0], "2.0"), ([1, "3"], "'3'"), ([1, None], "None"), ([2**70], repr(2**70)),
    ([-(2**70)], repr(-(2**70))), ([1, [2]], "[2]"),
])
def test_a_bad_id_is_named(ids, shown):
    with pytest.raises(InvalidRequestError) as e:
        _processor()._tokenize({"prompt_token_ids": ids})
    assert e.value.param == "prompt_token_ids"
    assert f"holds {shown}" in str(e.value)


def test_numpy_ids_are_refused_as_before():
    np = pytest.importorskip("numpy")
    with pytest.raises(InvalidRequestError, match="holds"):
        _processor()._tokenize({"prompt_token_ids": [np.int64(3)]})
