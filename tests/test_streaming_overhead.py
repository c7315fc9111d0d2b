"""The per-token streaming hot paths (issue 15 item 4) equal the plain forms they replace:
the detokenizer's direct Rust decode equals ``tokenizer.decode`` (stop strings, special
tokens, multi-byte characters), the hand-built SSE chunks parse to the dicts they stood for,
and outputs survive pickling (an engine process sends them) unchanged."""

from __future__ import annotations

import copy
import json
import pickle
import random

import pytest

from octavo.engine.detokenizer import IncrementalDetokenizer, rust_decoder
from octavo.engine.output_processor import RequestTimes
from octavo.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    from octavo.default_model import default_model_path

    try:
        path = default_model_path()
    except (ImportError, ValueError) as e:
        pytest.skip(f"no embedded default model: {e}")
    from octavo.model_loader.gguf_file import open_gguf

    return open_gguf(path).load_tokenizer()


def _detok(tok, ids, prompt, params, fast: bool):
    d = IncrementalDetokenizer(tok, prompt, params)
    if not fast:
        d._fast = None
    for t in ids:
        if d.add_token(t):
            break
    d.flush()
    return d.text, d.stop_reason


def test_rust_decode_equals_the_tokenizers_decode(tokenizer):
    tok = tokenizer
    assert rust_decoder(tok, True) is not None  # the fast path is taken for this tokenizer
    rng = random.Random(0)
    base = tok.encode("Hello wörld! 日本語のテキスト 🎉🎉 <|im_start|> tabs\t and\n\n  spaces")
    specials = tok.all_special_ids
    for _ in range(200):
        ids = [rng.randrange(len(tok)) if rng.random() < 0.4 else rng.choice(base)
               for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.4:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 8))]
        params = SamplingParams(skip_special_tokens=rng.random() < 0.5,
                                spaces_between_special_tokens=rng.random() < 0.5,
                                stop=["e", "語"] if rng.random() < 0.3 else [])
        assert _detok(tok, ids, prompt, params, True) == _detok(tok, ids, prompt, params,
                                                                False), ids


def test_a_tokenizer_with_its_own_decode_keeps_the_python_path(tokenizer):
    class Custom(type(tokenizer)):
        def decode(self, *args, **kwargs):  # e.g. a subclass that post-processes text
            return super().decode(*args, **kwargs).upper()

    tok = copy.copy(tokenizer)
    tok.__class__ = Custom
    assert rust_decoder(tok, True) is None
    text, _ = _detok(tok, tokenizer.encode(" hello there"), [1], SamplingParams(), True)
    assert text == " HELLO THERE"


def test_sse_chunks_parse_to_the_dicts_they_replace():
    from octavo.entrypoints.openai.serving_completions import _choice, _choice_json
    from octavo.entrypoints.openai.serving_engine import ChunkFramer, sse

    framer = ChunkFramer('cmpl-"x"', "text_completion", 17, "org/model é")
    for finish, stop in [(None, None), ("stop", "\n\\é"), ("length", None), ("stop", 128001)]:
        for text in ["", 'h\u00e9llo "q" \\ \ud800 x', "\U0001f389 \x00\t"]:
            comp = CompletionOutput(0, text, [1], None, None, finish, stop)
            event = framer.event(_choice_json(3, text, comp))
            plain = sse({"id": 'cmpl-"x"', "object": "text_completion", "created": 17,
                         "model": "org/model é",
                         "choices": [_choice(3, text, comp, None, None)]})
            assert event.startswith("data: ") and event.endswith("\n\n")
            assert json.loads(event[6:]) == json.loads(plain[6:])


def test_outputs_pickle_unchanged():
    out = RequestOutput(
        "r", "p", [1, 2], [None, {2: Logprob(-0.5, 1, "b")}],
        [CompletionOutput(0, "x", [3], -1.0, [{3: Logprob(-1.0, 1, "x")}], "stop", "s"),
         CompletionOutput(1, "y", [4], None, None)],
        True, RequestTimes(1.0, 2.0, 3.0), 5, "err")
    for clone in (pickle.loads(pickle.dumps(out)), copy.deepcopy(out), copy.copy(out)):
        assert clone == out
    assert pickle.loads(pickle.dumps(out)).metrics.queue_seconds == 1.0


def test_a_long_silent_run_does_not_grow_the_decode_window():
    """Tokens that decode to nothing (a tokenizer without the model's vocabulary, as with
    dummy weights) must not make each later decode longer: the window stays bounded and the
    text is unchanged."""
    seen: list[int] = []

    class Silent:
        def decode(self, ids, **kwargs):
            seen.append(len(ids))
            return "".join("x" for t in ids if t == 7)

    d = IncrementalDetokenizer(Silent(), [1, 2, 3], SamplingParams())
    for _ in range(500):
        d.add_token(5)
    d.add_token(7)
    d.add_token(7)
    d.flush()
    assert d.text == "xx"
    assert max(seen) <= 16


class _Letters:
    """Token t decodes to one letter, t % 26 after 'a'; 26 decodes to a two-line break."""

    def decode(self, ids, **kwargs):
        return "".join("\r\n" if t == 26 else chr(97 + t % 26) for t in ids)


@pytest.mark.parametrize("include", [False, True])
def test_a_long_text_is_read_by_its_end_and_cut_at_its_stop(include):
    """The text kept as a buffer (a step reads only its end) equals the plain string over a
    long output, line breaks untranslated; a stop string found late cuts it where the plain
    string would be cut."""
    toks = [(i * 7) % 27 for i in range(6000)]
    want = _Letters().decode(toks)
    d = IncrementalDetokenizer(_Letters(), [1, 2], SamplingParams(max_tokens=10**5))
    for i, t in enumerate(toks):
        assert not d.add_token(t)
        if i % 997 == 0:
            assert d.text_since(max(0, d.text_len - 50)) == want[:d.text_len][-50:]
    d.flush()
    assert d.text == want and d.text_len == len(want)
    assert d.text_since(100, 150) == want[100:150] and d.text_since(150, 100) == ""
    stop = "zzq"  # not in the text yet: appended as three tokens
    d = IncrementalDetokenizer(_Letters(), [1, 2], SamplingParams(
        stop=["never", stop], include_stop_str_in_output=include, max_tokens=10**5))
    for t in toks:
        d.add_token(t)
    hits = [d.add_token(t) for t in (25, 25, 16)]  # the request ends at the hit
    assert hits == [False, False, True]
    end = len(want) + (3 if include else 0)
    assert d.text == (want + stop)[:end] and d.stop_reason == stop and d.text_len == end
