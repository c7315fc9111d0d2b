"""A one-request check that an engine serves through the OpenAI app (in process, ASGI)."""

from __future__ import annotations

import asyncio


def assert_completes(engine, model: str, max_tokens: int = 4,
                     prompt: str = "w5 w17 w300") -> None:
    """POST /v1/completions to ``engine``'s app; 200 with ``max_tokens`` tokens (EOS
    ignored). ``prompt``: words of tests.tiny_models.add_word_tokenizer's vocabulary."""
    from octavo.entrypoints.openai.api_server import build_app
    from tests.test_server_ops_flags import _asgi

    r = asyncio.run(_asgi(build_app(engine), "POST", "/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True}))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == max_tokens
