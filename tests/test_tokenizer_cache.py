"""The GGUF tokenizer cache: converted once, then loaded; the cached tokenizer behaves as the
converted one (ids, text, special tokens, chat template, EOS); a changed file or a damaged
entry is converted again."""

from __future__ import annotations

import os

import pytest

from octavo.model_loader import tokenizer_cache
from octavo.model_loader.gguf_file import GGUFCheckpoint

TEXTS = ["The capital of France is", "héllo wörld 🚀 1234\n\tx", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def gguf():
    from octavo.default_model import default_model_path

    return GGUFCheckpoint(default_model_path())


@pytest.fixture(scope="module")
def converted(gguf):
    """One real conversion of the file's tokenizer (~5 s), shared: the tests count the builds
    that the cache asks for and hand back this one."""
    return gguf._build_tokenizer()


def _counting_build(gguf, converted, monkeypatch) -> list:
    built = []
    monkeypatch.setattr(gguf, "_build_tokenizer", lambda: built.append(1) or converted)
    return built


def _same(a, b):
    for t in TEXTS:
        ids = a(t, add_special_tokens=False)["input_ids"]
        assert ids == b(t, add_special_tokens=False)["input_ids"]
        assert a.decode(ids) == b.decode(ids)
    assert a.eos_token_id == b.eos_token_id and len(a) == len(b)
    chat = [{"role": "user", "content": "Write a haiku."}]
    assert (a.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == b.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))


def test_converted_once_then_loaded(gguf, converted, tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    built = _counting_build(gguf, converted, monkeypatch)
    first = gguf.load_tokenizer()
    entry = tmp_path / "gguf-tokenizers" / tokenizer_cache.cache_key(gguf.path)
    assert built == [1] and entry.is_dir() and first is converted
    again = gguf.load_tokenizer()
    assert built == [1]  # from the cache
    _same(first, again)
    assert not [p for p in os.listdir(entry.parent) if p.startswith(".tmp-")]


def test_damaged_entry_or_cache_off_converts_again(gguf, converted, tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "gguf-tokenizers" / tokenizer_cache.cache_key(gguf.path)
    entry.mkdir(parents=True)
    (entry / "tokenizer_config.json").write_text("{not json")
    built = _counting_build(gguf, converted, monkeypatch)
    tok = gguf.load_tokenizer()
    assert built == [1] and (entry / "tokenizer.json").is_file() and tok is converted
    # The rewritten entry loads, without a build, as the conversion.
    _same(gguf.load_tokenizer(), converted)
    assert built == [1]
    monkeypatch.setenv("OCTAVO_TOKENIZER_CACHE", "0")
    assert gguf.load_tokenizer() is converted
    assert built == [1, 1]


def test_key_follows_the_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 16)
    k1 = tokenizer_cache.cache_key(str(f))
    os.utime(f, ns=(1, 1))
    assert tokenizer_cache.cache_key(str(f)) != k1
