"""Large request bodies are parsed and validated off the event loop, with the garbage
collector paused (octavo/entrypoints/openai/request_body.py, collector_pause.py), and answer
exactly what small ones answer.

One AsyncLLM (the embedded default model) for the module; the apps run in the test's event
loop through in-process ASGI transports, so "the event loop's thread" is the test's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import pytest

pytest.importorskip("fastapi")
try:
    import httpx
except ImportError:  # newer openai releases ship the same client as httpx2
    httpx = pytest.importorskip("httpx2")

from typing import Annotated  # noqa: E402

from fastapi import Body, Request  # noqa: E402
from fastapi.routing import APIRoute  # noqa: E402

from octavo.entrypoints.openai import api_server as openai_server  # noqa: E402
from octavo.entrypoints.openai import protocol, request_body  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from octavo.entrypoints.openai.errors import APIError  # noqa: E402
from octavo.entrypoints.openai.protocol import CompletionRequest
from tests.server_apps import asgi_client as _client  # noqa: E402
from tests.server_apps import in_process_engine  # noqa: E402

LARGE = request_body.LARGE_BODY_BYTES
JSON = {"content-type": "application/json"}


# Each test waits for the engine to go idle after it (tests/server_apps.py).
pytestmark = pytest.mark.usefixtures("settle_engine")


@pytest.fixture(scope="module")
def engine():
    yield from in_process_engine(256, 8)


def _post_on_loop(app, path: str, **kwargs):
    """POST to ``app`` in process: (the event loop's thread, the response)."""
    async def main():
        async with _client(app) as c:
            r = await c.post(path, **kwargs)
        return threading.get_ident(), r

    return asyncio.run(main())


def _raw(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


class _Recorder:
    """Wraps a function: the thread and the collector's state of each call."""

    def __init__(self, fn, wants=lambda *a: True) -> None:
        self.fn, self.wants, self.calls = fn, wants, []

    def __call__(self, *args, **kwargs):
        if self.wants(*args):
            self.calls.append((threading.get_ident(), gc.isenabled()))
        return self.fn(*args, **kwargs)


# ------------------------------------------------------------------ off the event loop
def test_large_completion_is_parsed_and_validated_off_the_loop(apps, monkeypatch):
    """The regression: FastAPI parsed and validated an 8 MB body on the event loop."""
    loads = _Recorder(json.loads, lambda s, *a: len(s) > LARGE)
    monkeypatch.setattr(json, "loads", loads)
    # Called by CompletionRequest's prompt validator, looked up when it runs.
    count = _Recorder(protocol.prompt_count)
    monkeypatch.setattr(protocol, "prompt_count", count)
    body = {"prompt": [[7] * 30] * 2000, "max_tokens": 1}  # 2000 prompts: over the cap

    loop_thread, r = _post_on_loop(apps["openai"], "/v1/completions", content=_raw(body),
                                   headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "2000 prompts" in r.json()["error"]["message"]
    assert len(loads.calls) == 1 and len(count.calls) == 1  # FastAPI did not validate again
    (parse_thread, gc_on_in_parse), = loads.calls
    assert parse_thread != loop_thread, "the body was parsed on the event loop"
    assert count.calls[0][0] != loop_thread, "the body was validated on the event loop"
    assert not gc_on_in_parse and not count.calls[0][1], "the collector ran meanwhile"
    assert gc.isenabled()


def test_small_body_keeps_the_event_loop(apps, monkeypatch):
    count = _Recorder(protocol.prompt_count)
    monkeypatch.setattr(protocol, "prompt_count", count)

    loop_thread, r = _post_on_loop(apps["openai"], "/v1/completions",
                                   json={"prompt": [[7, 8]] * 2000})
    assert r.status_code == 400
    assert [t for t, _ in count.calls] == [loop_thread]


def test_accepted_large_request_is_served_validated_once(apps, monkeypatch):
    """The worker's model reaches the route as it is (pydantic does not validate an
    instance of the route's model again): a 70 KB /tokenize request is served."""
    # Called by the messages list's cap, looked up when it runs.
    capped = _Recorder(protocol._refuse_too_many)
    monkeypatch.setattr(protocol, "_refuse_too_many", capped)
    body = {"messages": [{"role": "user", "content": "Name a colour. " * 5000}]}

    loop_thread, r = _post_on_loop(apps["openai"], "/tokenize", content=_raw(body), headers=JSON)
    assert r.status_code == 200 and r.json()["count"] > 15_000, r.text
    (thread, _), = capped.calls
    assert thread != loop_thread


def test_large_generate_is_parsed_off_the_loop_with_the_collector_paused(apps, monkeypatch):
    loads = _Recorder(json.loads, lambda s, *a: len(s) > LARGE)
    monkeypatch.setattr(json, "loads", loads)
    body = {"prompt": "hi", "stop": [[0]] * 20_000}

    loop_thread, r = _post_on_loop(apps["simple"], "/generate", content=_raw(body),
                                   headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    (thread, gc_on), = loads.calls
    assert thread != loop_thread and not gc_on
    assert gc.isenabled()


# ------------------------------------------------------------------ the same answers
_BAD = [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2'),  # truncated
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),  # not UTF-8
    ("/v1/completions", b"[" * 100_000),  # nested too deeply
    ("/v1/completions", b'{"prompt": "hi", "n": ' + b"9" * 5000 + b"}"),
    ("/v1/completions", b"   "),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b"null"),
    ("/v1/completions", {"max_tokens": 2}),
    ("/v1/completions", {"prompt": 1.5}),
    ("/v1/completions", {"prompt": "a\ud800b"}),
    ("/v1/completions", {"prompt": "hi", "temperature": float("nan")}),
    ("/v1/completions", {"prompt": "hi", "n": 0, "top_p": 2, "stop": 3}),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 2000}),
    ("/v1/completions", {"prompt": ["hi"] * 1025}),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}),
    ("/v1/completions", {"prompt": "hi", "model": "no-such-model"}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [1]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 5000}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "x": "\ud800"}]}),
    ("/tokenize", {"prompt": 3}),
    ("/detokenize", {"tokens": [1, -1]}),
    ("/detokenize", {"tokens": [1, 10**9]}),
    ("/generate", b'{"prompt": "hi"'),
    ("/generate", b"[" * 100_000),
    ("/generate", {"prompt": "hi", "top_k": 2**63}),
    ("/generate", {"prompt": "hi", "stop": ["x"] * 2000}),
    ("/generate", {"prompt": "hi", "nope": 1}),
]
_GOOD = [
    ("/tokenize", {"prompt": "hello there"}),
    ("/detokenize", {"tokens": [1, 2, 3]}),
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3,
                         "temperature": 0}),
    ("/generate", {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}),
]


def _answers(apps, cases, headers=JSON) -> list[tuple[int, dict]]:
    async def main():
        out = []
        async with _client(apps["openai"]) as oc, _client(apps["simple"]) as sc:
            for path, body in cases:
                c = sc if path == "/generate" else oc
                r = await c.post(path, content=_raw(body), headers=headers)
                data = r.json()
                if r.status_code == 200 and "choices" in data:
                    data = data["choices"]  # (a fresh id and time every response)
                out.append((r.status_code, data))
        return out

    return asyncio.run(main())


@pytest.mark.parametrize("headers, json_content", [
    (JSON, True), ({"content-type": "application/merge-patch+json"}, True),
    ({"content-type": "text/plain"}, False), ({}, False)], ids=["json", "+json", "text", "none"])
def test_the_worker_answers_what_fastapi_answers(apps, monkeypatch, headers, json_content):
    """Every case once as a small body (FastAPI's path; /generate on the loop) and once
    taken for a large one (the worker's path): the same status and body. FastAPI reads
    no JSON from a body of another content type (a 400): neither does the worker."""
    cases = _BAD + _GOOD if headers == JSON else _BAD[:8] + _GOOD[:1]
    monkeypatch.setattr(request_body, "LARGE_BODY_BYTES", 10**9)
    small = _answers(apps, cases, headers)
    monkeypatch.setattr(request_body, "LARGE_BODY_BYTES", 0)
    worker = _Recorder(request_body._paused)
    monkeypatch.setattr(request_body, "_paused", worker)
    large = _answers(apps, cases, headers)
    for (path, body), a, b in zip(cases, small, large):
        assert a == b, (path, _raw(body)[:80])
    # /generate reads its body whatever the content type.
    generate = sum(path == "/generate" for path, _ in cases)
    assert len(worker.calls) == (len(cases) if json_content else generate)
    if headers == JSON:
        assert [s for s, _ in small] == [404 if b"no-such-model" in _raw(body) else 400
                                         for _, body in _BAD] + [200] * len(_GOOD), small


def test_openapi_schema_is_fastapis(engine, monkeypatch):
    served = build_app(engine, ServerSettings(shutdown_engine=False)).openapi()
    monkeypatch.setattr(openai_server, "offloaded_body_route", lambda offload: APIRoute)
    plain = build_app(engine, ServerSettings(shutdown_engine=False)).openapi()
    assert json.dumps(served, sort_keys=True) == json.dumps(plain, sort_keys=True)
    body = served["paths"]["/v1/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"}


# ------------------------------------------------------------------ the worker's part
def test_a_refused_body_is_freed_in_the_worker():
    """Nothing the error holds keeps the parsed body alive: it is freed while the collector
    is still paused, not later on the event loop (or by a collection walking it)."""
    body = json.dumps({"prompt": [[0]] * 100_000}).encode()
    before = len(gc.get_objects())
    with pytest.raises(APIError) as info:
        request_body._paused(lambda b: request_body.validated_body(CompletionRequest, b),
                             body)
    assert info.value.status == 400 and info.value.param == "prompt"
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert len(gc.get_objects()) - before < 1000
    assert gc.isenabled()


def test_body_model_of_the_routes(apps):
    routes = {r.path: r for r in apps["openai"].routes if isinstance(r, APIRoute)}
    models = {p: request_body.body_model(r.endpoint) for p, r in routes.items()
              if r.body_field is not None}
    assert models == {"/v1/completions": protocol.CompletionRequest,
                      "/v1/chat/completions": protocol.ChatCompletionRequest,
                      "/tokenize": protocol.TokenizeRequest,
                      "/detokenize": protocol.DetokenizeRequest}


EMBED = Body(embed=True)


def _takes_model(req: CompletionRequest, raw: Request):
    pass


def _embedded(req: Annotated[CompletionRequest, Body(embed=True)]):
    pass


def _embedded_by_default(req: CompletionRequest = EMBED):
    pass


def _with_another_body(req: CompletionRequest, extra: int = Body()):
    pass


def _two_models(a: CompletionRequest, b: protocol.TokenizeRequest):
    pass


def _unresolvable(req: NoSuchModel):  # noqa: F821
    pass


@pytest.mark.parametrize("endpoint, model", [
    (_takes_model, CompletionRequest), (_embedded, None), (_embedded_by_default, None),
    (_with_another_body, None), (_two_models, None), (_unresolvable, None)])
def test_body_model_only_for_a_whole_body(endpoint, model):
    """Any endpoint whose body FastAPI does not validate as one model is left to FastAPI."""
    assert request_body.body_model(endpoint) is model


@pytest.mark.parametrize("content_type, expected", [
    ("application/json", True), ("application/json; charset=utf-8", True),
    ("Application/JSON", True), ("application/merge-patch+json", True),
    ("text/plain", False), ("application/x-www-form-urlencoded", False), ("", False),
    (None, False), ("text/json", False)])
def test_json_content_types(content_type, expected):
    assert request_body.is_json_content(content_type) is expected
