"""SamplingParams / BeamSearchParams / outputs: defaults, normalisation, validation."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from octavo.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    SamplingType,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SP_FILE = REPO_ROOT / "octavo" / "sampling_params.py"


# ----------------------------------------------------------------------------- defaults


def test_defaults_match_vllm():
    sp = SamplingParams()
    assert sp.n == 1
    assert sp.best_of is None
    assert sp.presence_penalty == 0.0
    assert sp.frequency_penalty == 0.0
    assert sp.repetition_penalty == 1.0
    assert sp.temperature == 1.0
    assert sp.top_p == 1.0
    assert sp.top_k == 0 and not sp.top_k_enabled
    assert sp.min_p == 0.0
    assert sp.seed is None
    assert sp.stop == []
    assert sp.stop_token_ids == []
    assert sp.bad_words == []
    assert sp.ignore_eos is False
    assert sp.max_tokens == 16
    assert sp.min_tokens == 0
    assert sp.logprobs is None
    assert sp.prompt_logprobs is None
    assert sp.detokenize is True
    assert sp.skip_special_tokens is True
    assert sp.spaces_between_special_tokens is True
    assert sp.include_stop_str_in_output is False
    assert sp.logit_bias is None
    assert sp.allowed_token_ids is None
    assert sp.output_kind is RequestOutputKind.CUMULATIVE
    assert sp.truncate_prompt_tokens is None
    assert sp.use_beam_search is False
    assert sp.length_penalty == 1.0
    assert sp.early_stopping is False
    assert sp.sampling_type is SamplingType.RANDOM
    assert sp.all_stop_token_ids == set()
    assert sp.eos_token_id is None
    assert sp.output_text_buffer_length == 0


def test_enum_values():
    assert [k.value for k in RequestOutputKind] == [0, 1, 2]
    assert [k.name for k in RequestOutputKind] == ["CUMULATIVE", "DELTA", "FINAL_ONLY"]
    assert [int(t) for t in SamplingType] == [0, 1, 2]
    assert [t.name for t in SamplingType] == ["GREEDY", "RANDOM", "RANDOM_SEED"]


# ----------------------------------------------------------------------------- normalisation


def test_stop_string_becomes_list():
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]


def test_stop_token_ids_become_list_and_seed_all_stop():
    sp = SamplingParams(stop_token_ids=(5, 7))
    assert sp.stop_token_ids == [5, 7]
    assert sp.all_stop_token_ids == {5, 7}


def test_token_id_lists_drop_repeats():
    # Each step builds its masks from these lists: a million copies of a few ids (found by
    # scripts/fuzz_server.py) made every step of the batch ten times slower.
    p = SamplingParams(allowed_token_ids=[9, 5, 9] * 500_000, stop_token_ids=(7, 3, 7, 7))
    assert p.allowed_token_ids == [9, 5] and p.stop_token_ids == [7, 3]
    assert p.all_stop_token_ids == {3, 7}


def test_bad_words_string_becomes_list():
    assert SamplingParams(bad_words="foo").bad_words == ["foo"]


def test_top_k_minus_one_is_disabled():
    sp = SamplingParams(top_k=-1)
    assert sp.top_k == 0 and not sp.top_k_enabled
    sp = SamplingParams(top_k=5)
    assert sp.top_k == 5 and sp.top_k_enabled


def test_numbers_become_floats():
    sp = SamplingParams(temperature=1, top_p=1, presence_penalty=1, length_penalty=2)
    for name in ("temperature", "top_p", "presence_penalty", "length_penalty"):
        assert type(getattr(sp, name)) is float


def test_logit_bias_string_keys_become_ints():
    sp = SamplingParams(logit_bias={"12": 5, 3: -1.5})
    assert sp.logit_bias == {12: 5.0, 3: -1.5}


def test_output_kind_from_int():
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    assert SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY).output_kind is (
        RequestOutputKind.FINAL_ONLY
    )


@pytest.mark.parametrize("temperature", [0.0, 0, 1e-6])
def test_greedy_normalisation(temperature):
    sp = SamplingParams(temperature=temperature, top_p=0.5, top_k=10, min_p=0.3, seed=3)
    assert sp.sampling_type is SamplingType.GREEDY
    assert sp.top_p == 1.0
    assert sp.top_k == 0 and not sp.top_k_enabled
    assert sp.min_p == 0.0


def test_sampling_type_random_and_seeded():
    assert SamplingParams(temperature=0.7).sampling_type is SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=0).sampling_type is SamplingType.RANDOM_SEED
    sp = SamplingParams(temperature=0.7, top_p=0.5, top_k=10, min_p=0.3)
    assert (sp.top_p, sp.top_k, sp.min_p) == (0.5, 10, 0.3)


def test_edge_values_accepted():
    SamplingParams(
        n=3,
        best_of=3,
        presence_penalty=-2,
        frequency_penalty=2,
        repetition_penalty=1e-3,
        top_p=1e-9,
        min_p=1.0,
        max_tokens=None,
        min_tokens=5,
        logprobs=-1,
        prompt_logprobs=0,
        truncate_prompt_tokens=-1,
        allowed_token_ids=[0],
        early_stopping="never",
        seed=-5,
    )
    SamplingParams(max_tokens=4, min_tokens=4)


def test_length_penalty_outside_beam_search_is_accepted():
    assert SamplingParams(length_penalty=0.5).length_penalty == 0.5


def test_beam_search_with_greedy_temperature():
    sp = SamplingParams(use_beam_search=True, temperature=0.0, length_penalty=1.2)
    assert sp.use_beam_search and sp.length_penalty == 1.2


def test_output_text_buffer_length():
    assert SamplingParams(stop=["ab", "abcd"]).output_text_buffer_length == 3
    assert (
        SamplingParams(stop=["abcd"], include_stop_str_in_output=True).output_text_buffer_length
        == 0
    )


# ----------------------------------------------------------------------------- validation

BAD_VALUES = [
    # (kwargs, field name, offending value as it should appear in the message)
    ({"n": 0}, "n", "0"),
    ({"n": 1.5}, "n", "1.5"),
    ({"n": True}, "n", "True"),
    ({"best_of": 1, "n": 2}, "best_of", "1"),
    ({"best_of": "2"}, "best_of", "'2'"),
    ({"presence_penalty": -2.5}, "presence_penalty", "-2.5"),
    ({"presence_penalty": 2.01}, "presence_penalty", "2.01"),
    ({"frequency_penalty": 3}, "frequency_penalty", "3"),
    ({"frequency_penalty": -2.1}, "frequency_penalty", "-2.1"),
    ({"repetition_penalty": 0}, "repetition_penalty", "0"),
    ({"repetition_penalty": -1.0}, "repetition_penalty", "-1.0"),
    ({"temperature": -1.0}, "temperature", "-1.0"),
    ({"temperature": "hot"}, "temperature", "'hot'"),
    ({"temperature": None}, "temperature", "None"),
    ({"temperature": math.nan}, "temperature", "nan"),
    ({"temperature": math.inf}, "temperature", "inf"),
    ({"top_p": 0.0}, "top_p", "0.0"),
    ({"top_p": 1.1}, "top_p", "1.1"),
    ({"top_p": "x"}, "top_p", "'x'"),
    ({"top_k": -2}, "top_k", "-2"),
    ({"top_k": 2.5}, "top_k", "2.5"),
    ({"min_p": -0.1}, "min_p", "-0.1"),
    ({"min_p": 1.5}, "min_p", "1.5"),
    ({"seed": 1.5}, "seed", "1.5"),
    ({"seed": "42"}, "seed", "'42'"),
    ({"stop": ""}, "stop", "''"),
    ({"stop": ["a", ""]}, "stop", "''"),
    ({"stop": [1]}, "stop", "1"),
    ({"stop": 5}, "stop", "5"),
    ({"stop": ["x"], "detokenize": False}, "stop", "'x'"),
    ({"stop_token_ids": [1, "a"]}, "stop_token_ids", "'a'"),
    ({"stop_token_ids": [-3]}, "stop_token_ids", "-3"),
    ({"stop_token_ids": 7}, "stop_token_ids", "7"),
    ({"bad_words": [""]}, "bad_words", "''"),
    ({"bad_words": [3]}, "bad_words", "3"),
    ({"ignore_eos": 1}, "ignore_eos", "1"),
    ({"max_tokens": 0}, "max_tokens", "0"),
    ({"max_tokens": -5}, "max_tokens", "-5"),
    ({"max_tokens": 10.0}, "max_tokens", "10.0"),
    ({"min_tokens": -1}, "min_tokens", "-1"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens", "20"),
    ({"min_tokens": 1.0}, "min_tokens", "1.0"),
    ({"logprobs": -2}, "logprobs", "-2"),
    ({"logprobs": 1.5}, "logprobs", "1.5"),
    ({"prompt_logprobs": -5}, "prompt_logprobs", "-5"),
    ({"prompt_logprobs": "3"}, "prompt_logprobs", "'3'"),
    ({"detokenize": "yes"}, "detokenize", "'yes'"),
    ({"skip_special_tokens": None}, "skip_special_tokens", "None"),
    ({"spaces_between_special_tokens": 0}, "spaces_between_special_tokens", "0"),
    ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output", "'no'"),
    ({"use_beam_search": 1}, "use_beam_search", "1"),
    ({"logit_bias": [1, 2]}, "logit_bias", "[1, 2]"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias", "'abc'"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias", "-1"),
    ({"logit_bias": {5: "big"}}, "logit_bias", "'big'"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "[]"),
    ({"allowed_token_ids": [1, -1]}, "allowed_token_ids", "-1"),
    ({"output_kind": 7}, "output_kind", "7"),
    ({"output_kind": "delta"}, "output_kind", "'delta'"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "0"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "-2"),
    ({"length_penalty": "long"}, "length_penalty", "'long'"),
    ({"length_penalty": math.nan}, "length_penalty", "nan"),
    ({"early_stopping": "sometimes"}, "early_stopping", "'sometimes'"),
    ({"use_beam_search": True, "temperature": 0.8}, "temperature", "0.8"),
]


@pytest.mark.parametrize(
    ("kwargs", "name", "shown"), BAD_VALUES, ids=[f"{n}={s}" for _, n, s in BAD_VALUES]
)
def test_invalid_values_raise_naming_field_and_value(kwargs, name, shown):
    with pytest.raises(ValueError) as excinfo:
        SamplingParams(**kwargs)
    msg = str(excinfo.value)
    assert re.search(rf"\b{re.escape(name)}\b", msg), msg
    assert shown in msg, msg


def test_temperature_message_format():
    with pytest.raises(ValueError, match=r"^temperature must be non-negative, got -1\.0$"):
        SamplingParams(temperature=-1.0)


# ----------------------------------------------------------------------------- generation config


def test_update_from_generation_config():
    sp = SamplingParams(stop_token_ids=[9])
    sp.update_from_generation_config({"eos_token_id": [2, 7]}, model_eos_token_id=2)
    assert sp.eos_token_id == 2
    assert sp.stop_token_ids == [9, 7]
    assert sp.all_stop_token_ids == {2, 7, 9}


def test_update_from_generation_config_int_and_ignore_eos():
    sp = SamplingParams(ignore_eos=True)
    sp.update_from_generation_config({"eos_token_id": 4}, model_eos_token_id=1)
    assert sp.stop_token_ids == []  # extra EOS ids do not stop when ignoring EOS
    assert sp.all_stop_token_ids == {1, 4}  # ... but are still masked below min_tokens
    sp = SamplingParams()
    sp.update_from_generation_config(None, model_eos_token_id=None)
    assert sp.all_stop_token_ids == set() and sp.eos_token_id is None


# ----------------------------------------------------------------------------- clone / repr


def test_clone_is_independent():
    sp = SamplingParams(
        stop=["a"], stop_token_ids=[1], logit_bias={1: 1.0}, allowed_token_ids=[1, 2], seed=3
    )
    sp.update_from_generation_config({}, model_eos_token_id=0)
    cp = sp.clone()
    assert cp == sp and cp is not sp
    assert cp.all_stop_token_ids == {0, 1} and cp.eos_token_id == 0
    cp.stop.append("b")
    cp.stop_token_ids.append(2)
    cp.logit_bias[5] = 2.0
    cp.allowed_token_ids.append(3)
    cp.all_stop_token_ids.add(99)
    assert sp.stop == ["a"]
    assert sp.stop_token_ids == [1]
    assert sp.logit_bias == {1: 1.0}
    assert sp.allowed_token_ids == [1, 2]
    assert 99 not in sp.all_stop_token_ids


def test_repr():
    text = repr(SamplingParams(temperature=0.5, stop="x"))
    assert text.startswith("SamplingParams(n=1, best_of=None, ")
    assert "temperature=0.5" in text and "stop=['x']" in text
    assert "_all_stop_token_ids" not in text


# ----------------------------------------------------------------------------- beam search


def test_beam_search_params_defaults():
    bp = BeamSearchParams(beam_width=4, max_tokens=32)
    assert (bp.ignore_eos, bp.temperature, bp.length_penalty) == (False, 0.0, 1.0)
    assert bp.include_stop_str_in_output is False


BAD_BEAM = [
    ({"beam_width": 0}, "beam_width", "0"),
    ({"beam_width": 2.0}, "beam_width", "2.0"),
    ({"max_tokens": 0}, "max_tokens", "0"),
    ({"max_tokens": None}, "max_tokens", "None"),
    ({"temperature": -0.5}, "temperature", "-0.5"),
    ({"temperature": "cold"}, "temperature", "'cold'"),
    ({"length_penalty": "x"}, "length_penalty", "'x'"),
    ({"ignore_eos": "no"}, "ignore_eos", "'no'"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output", "1"),
]


@pytest.mark.parametrize(
    ("kwargs", "name", "shown"), BAD_BEAM, ids=[f"{n}={s}" for _, n, s in BAD_BEAM]
)
def test_beam_search_params_validation(kwargs, name, shown):
    base = {"beam_width": 2, "max_tokens": 8}
    with pytest.raises(ValueError) as excinfo:
        BeamSearchParams(**{**base, **kwargs})
    msg = str(excinfo.value)
    assert name in msg and shown in msg, msg


# ----------------------------------------------------------------------------- outputs


def test_outputs_basic_and_repr():
    lp = Logprob(logprob=-0.5)
    assert lp.rank is None and lp.decoded_token is None
    comp = CompletionOutput(0, "hi", [1, 2], -1.0, [{1: lp}, {2: Logprob(-0.1, 1, "x")}])
    assert not comp.finished()
    comp.finish_reason = "length"
    assert comp.finished()
    out = RequestOutput("r0", "p", [5], None, [comp], finished=True)
    assert out.metrics is None and out.num_cached_tokens == 0
    text = repr(out)
    assert text.startswith("RequestOutput(request_id=r0, prompt='p', prompt_token_ids=[5]")
    assert "CompletionOutput(index=0, text='hi', token_ids=[1, 2]" in text
    assert "finish_reason=length" in text


def test_request_output_add():
    a = RequestOutput("r", "p", [1], None, [CompletionOutput(0, "a", [1], -1.0, None)], False)
    b = RequestOutput(
        "r", "p", [1], None, [CompletionOutput(0, "b", [2], -2.0, None, "stop", 7)], True
    )
    a.add(b, aggregate=True)
    c = a.outputs[0]
    assert (c.text, list(c.token_ids), c.cumulative_logprob) == ("ab", [1, 2], -2.0)
    assert c.finish_reason == "stop" and c.stop_reason == 7 and a.finished


# ----------------------------------------------------------------------------- torch-free


def test_source_has_no_torch_import():
    for path in (SP_FILE, REPO_ROOT / "octavo" / "outputs.py"):
        src = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+torch\b", src, re.MULTILINE), path


def test_import_does_not_load_torch():
    # If the package __init__ itself pulls in torch, this module cannot be blamed: skip
    # (the source check above still guards this file).
    code = (
        "import sys, octavo\n"
        "if 'torch' in sys.modules: sys.exit(3)\n"
        "import octavo.sampling_params, octavo.outputs\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    if proc.returncode == 3:
        pytest.skip("octavo/__init__.py imports torch eagerly")
    assert proc.returncode == 0, proc.stderr
