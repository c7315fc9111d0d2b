"""A streamed completion whose client is gone before its response starts: the handler sent
the request to the engine already (``start_request``), and nothing will ever read its
outputs, so dropping the unread iterator must abort it and give its KV blocks back, not let
it decode to max_tokens for nobody."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import pytest

pytest.importorskip("fastapi")

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from tests.tiny_models import make_word_llama  # noqa: E402


def test_a_client_gone_before_the_stream_starts_aborts_its_request(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_SERVER_EAGER_SEND", "1")
    llm = AsyncLLM.from_engine_args(EngineArgs(
        model=make_word_llama(str(tmp_path / "llama")), dtype="float32", max_model_len=512))
    app = build_app(llm, ServerSettings(served_model_names=["tiny"], shutdown_engine=False))
    aborted: list[str] = []
    real = llm.engine.abort_request
    llm.engine.abort_request = lambda rid, *a, **k: aborted.append(rid) or real(rid, *a, **k)
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 400,
                       "ignore_eos": True, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}

    async def main() -> list[dict]:
        inbox = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict] = []

        async def receive() -> dict:
            return inbox.pop(0) if inbox else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(scope, receive, send)
        gc.collect()
        deadline = time.monotonic() + 10
        while not aborted:
            assert time.monotonic() < deadline, "the request was not aborted"
            await asyncio.sleep(0.01)
        return sent

    try:
        sent = asyncio.run(main())
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
        deadline = time.monotonic() + 10
        pool = llm.engine.scheduler.kv.pool
        while llm.engine.has_unfinished_requests() or pool.num_free_blocks != pool.num_blocks:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert len(aborted) == 1  # ended by the abort, not by decoding its 400 tokens
    finally:
        del llm.engine.abort_request
        llm.shutdown()
