"""Hostile requests against both servers (issue 11): each is a 400 in OpenAI's error shape
naming the field at fault, and afterwards the engine is alive (/health 200), a normal request
completes and every KV block is back in the pool. Also: unexpected errors are JSON 500s, a
request that fails in the engine ends alone, chat templates are time-bounded, and a 4 MB
prompt being tokenized does not stall /health.

One AsyncLLM for the module; the OpenAI app and the simple /generate app share it through
in-process ASGI transports, and a real uvicorn server where timing matters.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
try:
    import httpx
except ImportError:  # newer openai releases ship the same client as httpx2
    httpx = pytest.importorskip("httpx2")

from octavo.entrypoints import api_server as simple_server  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from octavo.entrypoints.openai.errors import error_body  # noqa: E402
from octavo.entrypoints.openai.serving_engine import default_offload  # noqa: E402
from octavo.errors import RequestFailedError  # noqa: E402
from tests.running_server import RunningServer, wait_idle  # noqa: E402
from tests.server_apps import asgi_client as _client  # noqa: E402
from tests.server_apps import in_process_engine  # noqa: E402

MAX_LEN = 512
VOCAB = 49152  # the embedded default model's vocabulary
BAD = "a\ud800b"  # a lone surrogate: no UTF-8 encoding exists
I64_OVER, I64_UNDER = 2**63, -(2**63) - 1

COMPLETION = {"prompt": "The capital of France is", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2}
GENERATE = {"prompt": "The capital of France is", "max_tokens": 2}
NORMAL = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT,
          "/tokenize": {"prompt": "hello"}, "/detokenize": {"tokens": [1, 2]},
          "/generate": GENERATE}


# Each test waits for the engine to go idle after it (tests/server_apps.py).
pytestmark = pytest.mark.usefixtures("settle_engine")


@pytest.fixture(scope="module")
def engine():
    for llm in in_process_engine(MAX_LEN, 64):
        assert llm.model_config.hf_config.vocab_size == VOCAB
        yield llm


def _post(client, path: str, body) -> asyncio.Future:
    # json.dumps escapes a lone surrogate as \ud800, which is valid JSON text.
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def expect_refused(engine, app, path: str, body, param: str | None,
                   status: int = 400) -> dict:
    """``body`` is refused with ``status`` naming ``param``; then /health is 200, a normal
    request on the same route completes, and no KV block is held."""
    async def main() -> dict:
        async with _client(app) as c:
            r = await _post(c, path, body)
            assert r.status_code == status, r.text
            assert r.headers["content-type"].startswith("application/json")
            err = r.json()["error"]
            assert err["code"] == status and err["param"] == param, err
            assert set(err) == {"message", "type", "param", "code"}
            assert (await c.get("/health")).status_code == 200
            ok = await _post(c, path, NORMAL[path])
            assert ok.status_code == 200, ok.text
            return err

    err = asyncio.run(main())
    wait_idle(engine)
    pool = engine.engine.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert not engine.errored
    return err


def _cases(path: str, base: dict, fields: dict[str, list]) -> list:
    """One case per field, trying each of its values (a test item per value would spend
    more time in the per-test leak check than in the requests)."""
    return [pytest.param(path, [{**base, f: v} for v in values], f, id=f"{path}:{f}")
            for f, values in fields.items()]


# ------------------------------------------------------------------ the issue's requests
def test_issue_requests(engine, apps):
    for app, path in ((apps["openai"], "/v1/completions"), (apps["simple"], "/generate")):
        err = expect_refused(engine, app, path, {"prompt": "hi", "top_k": 9223372036854775808},
                             "top_k")
        assert "top_k" in err["message"]
        err = expect_refused(engine, app, path,
                             {"prompt": "hi", "min_tokens": 1, "stop_token_ids": [VOCAB]},
                             "stop_token_ids")
        assert str(VOCAB) in err["message"]
        expect_refused(engine, app, path, {"prompt": "hi \ud800"}, "prompt")
    err = expect_refused(engine, apps["simple"], "/generate",
                         {"prompt": "hi", "prompt_logprobs": 100000}, "prompt_logprobs")
    assert "100000" in err["message"]


# ------------------------------------------------------------------ out-of-range integers
_OUT_OF_RANGE = [I64_OVER, I64_UNDER, 10**30]
_INT_FIELDS = ["n", "best_of", "max_tokens", "min_tokens", "top_k", "logprobs",
               "truncate_prompt_tokens"]


@pytest.mark.parametrize("path, body, param", [
    *_cases("/v1/completions", COMPLETION, {
        **{f: _OUT_OF_RANGE for f in _INT_FIELDS + ["priority"]},
        "seed": [2**64, I64_UNDER, 10**30]}),
    *_cases("/v1/chat/completions", CHAT, {
        "top_logprobs": _OUT_OF_RANGE, "max_completion_tokens": _OUT_OF_RANGE,
        "max_tokens": _OUT_OF_RANGE, "n": [I64_OVER], "seed": [2**64]}),
])
def test_out_of_range_integers_openai(engine, apps, path, body, param):
    for b in body:
        expect_refused(engine, apps["openai"], path, b, param)


@pytest.mark.parametrize("path, body, param", _cases("/generate", GENERATE, {
    **{f: _OUT_OF_RANGE for f in _INT_FIELDS + ["prompt_logprobs"]},
    "seed": [2**64, I64_UNDER, 10**30]}))
def test_out_of_range_integers_generate(engine, apps, path, body, param):
    for b in body:
        expect_refused(engine, apps["simple"], path, b, param)


# ------------------------------------------------------------------ out-of-vocabulary ids
_OOV = {"stop_token_ids": [VOCAB], "allowed_token_ids": [0, VOCAB],
        "logit_bias": {str(VOCAB): 1.0}}


@pytest.mark.parametrize("app_name, path, body, param", [
    ("openai", "/v1/completions", {**COMPLETION, "prompt": [1, VOCAB]}, "prompt"),
    ("openai", "/v1/completions", {**COMPLETION, "prompt": [[1, 2], [VOCAB]]}, "prompt"),
    ("openai", "/detokenize", {"tokens": [1, VOCAB]}, "tokens"),
    *[("openai", "/v1/completions", {**COMPLETION, "min_tokens": 1, f: v}, f)
      for f, v in _OOV.items()],
    *[("openai", "/v1/chat/completions", {**CHAT, "min_tokens": 1, f: v}, f)
      for f, v in _OOV.items()],
    *[("simple", "/generate", {**GENERATE, "min_tokens": 1, f: v}, f)
      for f, v in _OOV.items()],
])
def test_out_of_vocabulary_ids(engine, apps, app_name, path, body, param):
    err = expect_refused(engine, apps[app_name], path, body, param)
    assert str(VOCAB) in err["message"]


# ------------------------------------------------------------------ huge counts
_HUGE = [1000, 10**6]


@pytest.mark.parametrize("app_name, path, body, param", [
    *[("openai", *c.values) for c in _cases("/v1/completions", COMPLETION, {
        "n": _HUGE, "best_of": _HUGE, "logprobs": _HUGE, "max_tokens": _HUGE,
        "min_tokens": _HUGE})],
    *[("openai", *c.values) for c in _cases("/v1/chat/completions", {**CHAT, "logprobs": True}, {
        "n": _HUGE, "best_of": _HUGE, "top_logprobs": _HUGE, "max_tokens": _HUGE,
        "max_completion_tokens": _HUGE})],
    # No max_tokens: min_tokens alone must still fit the context.
    ("openai", "/v1/chat/completions",
     {"messages": CHAT["messages"], "min_tokens": 10**6}, "min_tokens"),
    *[("simple", *c.values) for c in _cases("/generate", GENERATE, {
        "n": _HUGE, "best_of": _HUGE, "logprobs": _HUGE, "prompt_logprobs": _HUGE,
        "max_tokens": _HUGE, "min_tokens": _HUGE})],
])
def test_huge_counts(engine, apps, app_name, path, body, param):
    for b in body if isinstance(body, list) else [body]:
        expect_refused(engine, apps[app_name], path, b, param)


# ------------------------------------------------------------------ undecodable text
def _msg(**kw) -> dict:
    return {**CHAT, "messages": [{"role": "user", "content": "hi", **kw}]}


@pytest.mark.parametrize("app_name, path, body, param", [
    *[("openai", "/v1/completions", {**COMPLETION, f: v}, f) for f, v in (
        ("prompt", BAD), ("prompt", ["fine", BAD]), ("stop", BAD), ("stop", ["x", BAD]),
        ("bad_words", [BAD]), ("model", BAD), ("user", BAD), ("suffix", BAD),
        ("logit_bias", {BAD: 1.0}))],
    ("openai", "/v1/chat/completions", _msg(content=BAD), "messages"),
    ("openai", "/v1/chat/completions", _msg(role=BAD), "messages"),
    ("openai", "/v1/chat/completions",
     _msg(content=[{"type": "text", "text": BAD}]), "messages"),
    ("openai", "/v1/chat/completions", _msg(name=BAD), "messages"),
    *[("openai", "/v1/chat/completions", {**CHAT, f: BAD}, f)
      for f in ("chat_template", "stop", "user", "model")],
    ("openai", "/tokenize", {"prompt": BAD}, "prompt"),
    ("openai", "/tokenize", {"messages": [{"role": "user", "content": BAD}]}, "messages"),
    *[("simple", "/generate", {**GENERATE, f: v}, f)
      for f, v in (("prompt", BAD), ("stop", BAD), ("stop", [BAD]), ("bad_words", [BAD]))],
])
def test_undecodable_text(engine, apps, app_name, path, body, param):
    err = expect_refused(engine, apps[app_name], path, body, param)
    assert "\ud800" not in err["message"]


# ------------------------------------------------------------------ wrong types
@pytest.mark.parametrize("app_name, path, body, param", [
    *[("openai", "/v1/completions", {**COMPLETION, f: v}, f) for f, v in (
        ("n", True), ("max_tokens", True), ("top_k", False), ("seed", True),
        ("logprobs", True), ("priority", True), ("stop_token_ids", [True]),
        ("allowed_token_ids", [1.0]), ("prompt", [True]), ("prompt", True),
        ("stream", "yes"), ("echo", "yes"), ("ignore_eos", "yes"), ("n", 1.5),
        ("temperature", "0.5"), ("temperature", True), ("top_p", "1"),
        ("logit_bias", {"1": "x"}), ("logit_bias", {"1.5": 1}), ("logit_bias", {"-1": 1}),
        ("stream_options", {"include_usage": "yes"}))],
    *[("openai", "/v1/chat/completions", {**CHAT, f: v}, f) for f, v in (
        ("logprobs", "yes"), ("messages", "hi"), ("messages", []),
        ("add_generation_prompt", "yes"), ("top_logprobs", True), ("n", True))],
    ("openai", "/detokenize", {"tokens": [True]}, "tokens"),
    ("openai", "/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, "add_special_tokens"),
    *[("simple", "/generate", {**GENERATE, f: v}, f) for f, v in (
        ("n", True), ("max_tokens", 1.5), ("top_k", True), ("stream", "yes"),
        ("ignore_eos", "yes"), ("temperature", "0.5"), ("stop_token_ids", [True]),
        ("seed", "1"), ("logprobs", True))],
])
def test_wrong_types(engine, apps, app_name, path, body, param):
    expect_refused(engine, apps[app_name], path, body, param)


def test_floats_take_json_integers(engine, apps):
    async def main():
        async with _client(apps["openai"]) as c:
            r = await _post(c, "/v1/completions", {**COMPLETION, "temperature": 0,
                                                   "top_p": 1, "presence_penalty": 0,
                                                   "logit_bias": {"1": -100}})
            assert r.status_code == 200, r.text

    asyncio.run(main())


def test_schema_states_the_bounds(apps):
    props = apps["openai"].openapi()["components"]["schemas"]["CompletionRequest"]["properties"]

    def bounds(name: str) -> tuple:
        spec = next(s for s in props[name].get("anyOf", [props[name]])
                    if s.get("type") == "integer")
        # (pydantic writes bounds past 2**53 as JSON floats)
        return float(spec["minimum"]), float(spec["maximum"])

    for name, lo, hi in (("top_k", -1, 2**31 - 1), ("n", 1, 2**31 - 1),
                         ("seed", -(2**63), 2**64 - 1), ("priority", -(2**63), 2**63 - 1)):
        assert bounds(name) == (float(lo), float(hi)), name


# ------------------------------------------------------------------ errors never plain text
def test_error_body_survives_undecodable_text():
    body = error_body(400, "bad " + BAD + " x" * 5000, param=BAD)
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8")  # would raise unsanitized
    err = json.loads(raw)["error"]
    assert "\\ud800" in err["message"] and len(err["message"]) < 2100
    assert err["param"] == "a\\ud800b"


@pytest.mark.parametrize("which", ["openai", "simple"])
def test_unexpected_exception_is_json_500(engine, which):
    app = (build_app(engine, ServerSettings(shutdown_engine=False)) if which == "openai"
           else simple_server.build_app(engine, shutdown_engine=False))

    @app.get("/boom")
    async def boom():
        raise RuntimeError("kaboom " + BAD)

    async def main():
        async with _client(app) as c:
            r = await c.get("/boom")
            assert r.status_code == 500
            assert r.headers["content-type"].startswith("application/json")
            err = r.json()["error"]
            assert err["code"] == 500 and "kaboom" in err["message"]
            missing = await c.get("/no-such-route")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
            assert (await c.get("/health")).status_code == 200

    asyncio.run(main())


def test_malformed_bodies(engine, apps):
    deep = b"[" * 100_000 + b"]" * 100_000
    # Each says why (the OpenAI app said "There was an error parsing the body" for the
    # bodies FastAPI cannot decode, and "JSON decode error" without the reason).
    cases = [(b"{not json", "Expecting property name"), (deep, "nested too deeply"),
             (b'{"prompt": "hi", "n": 1' + b"0" * 5000 + b"}", "4300 digits"),
             (b'{"prompt": "hi", "user": "\xff"}', "can't decode byte 0xff"),
             (b'{"prompt": "hi", "temperature": NaN}', "temperature")]
    for app, path in ((apps["openai"], "/v1/completions"), (apps["simple"], "/generate")):
        for raw, why in cases:
            async def main(app=app, path=path, raw=raw, why=why):
                async with _client(app) as c:
                    r = await _post(c, path, raw)
                    assert r.status_code == 400, (raw[:40], r.text)
                    err = r.json()["error"]
                    assert err["code"] == 400 and why in err["message"], (raw[:40], err)
            asyncio.run(main())


# ------------------------------------------------------------------ a request failing alone
@pytest.mark.parametrize("app_name, path, body, stream_tail", [
    ("openai", "/v1/completions", COMPLETION, "data: [DONE]"),
    ("openai", "/v1/chat/completions", CHAT, "data: [DONE]"),
    ("simple", "/generate", GENERATE, None),
])
def test_request_failed_in_engine(engine, apps, monkeypatch, app_name, path, body,
                                  stream_tail):
    async def failing(prompt, params, request_id, priority=0, group_id=None):
        raise RequestFailedError(request_id, "its logits processor raised")
        yield  # an async generator, as AsyncLLM.generate

    monkeypatch.setattr(engine, "generate", failing)
    monkeypatch.setattr(engine, "start_request", failing)  # what the servers call

    async def main():
        async with _client(apps[app_name]) as c:
            r = await _post(c, path, body)
            assert r.status_code == 500, r.text
            err = r.json()["error"]
            assert err["type"] == "InternalServerError" and "logits processor" in err["message"]
            r = await _post(c, path, {**body, "stream": True})
            assert r.status_code == 200
            lines = [ln for ln in r.text.splitlines() if ln]
            if stream_tail is not None:
                assert lines[-1] == stream_tail
                lines = [ln.removeprefix("data: ") for ln in lines[:-1]]
            errors = [json.loads(ln)["error"] for ln in lines if "error" in json.loads(ln)]
            assert len(errors) == 1 and errors[0]["code"] == 500

    asyncio.run(main())
    monkeypatch.undo()
    expect_refused(engine, apps[app_name], path, {**body, "n": True}, "n")  # still serving


# ------------------------------------------------------------------ chat template bound
def test_request_chat_template_needs_trust(engine):
    """A request's chat_template is code: ``{{ 7 ** 10**9 }}`` would hold the GIL (every
    thread of the server) for hours, past any time bound. Refused unless the server trusts
    its clients (vLLM's --trust-request-chat-template)."""
    echo = {**CHAT, "chat_template": "{{ messages[0]['content'] }}"}
    for body in (echo, {**CHAT, "chat_template": "{{ 7 ** 10**9 }}"}):
        err = expect_refused(engine, build_app(engine, ServerSettings(shutdown_engine=False)),
                             "/v1/chat/completions", body, "chat_template")
        assert "--trust-request-chat-template" in err["message"]
    trusted = build_app(engine, ServerSettings(shutdown_engine=False,
                                               trust_request_chat_template=True))

    async def main():
        async with _client(trusted) as c:
            r = await _post(c, "/v1/chat/completions", echo)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == 4  # "Name a colour." alone

    asyncio.run(main())


def test_chat_template_time_bound(engine):
    app = build_app(engine, ServerSettings(shutdown_engine=False, chat_template_timeout=0.2,
                                           trust_request_chat_template=True))
    # About a second of Jinja loops: far past the bound, short enough to let it finish.
    slow = ("{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}"
            "{{ messages[0]['content'] }}")
    t0 = time.monotonic()
    err = expect_refused(engine, app, "/v1/chat/completions", {**CHAT, "chat_template": slow},
                         "chat_template")
    assert "0.2 s" in err["message"] and time.monotonic() - t0 < 5
    broken = expect_refused(engine, app, "/v1/chat/completions",
                            {**CHAT, "chat_template": "{% for %}"}, "chat_template")
    assert "chat template" in broken["message"]
    # The orphaned render ends on its own and gives its slot back.
    offload = default_offload()
    deadline = time.monotonic() + 30
    while offload.bounded_running:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_bounded_renders_cannot_pile_up():
    from octavo.entrypoints.openai.serving_engine import Offload, RendersBusy

    offload = Offload(workers=1, max_bounded=1)
    release = threading.Event()

    async def main():
        with pytest.raises(TimeoutError):  # abandoned, still running, holding the slot
            await offload.run_bounded(release.wait, timeout=0.05)
        assert offload.bounded_running == 1
        with pytest.raises(RendersBusy):
            await offload.run_bounded(lambda: "never runs", timeout=0.1)
        release.set()
        deadline = time.monotonic() + 5
        while offload.bounded_running:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await offload.run_bounded(lambda: "ok", timeout=5) == "ok"

    asyncio.run(main())


# ------------------------------------------------------------------ no starvation
@pytest.mark.parametrize("path, expect", [
    ("/tokenize", 200), ("/v1/completions", 400), ("/generate", 400)])
def test_health_answers_while_a_4mb_prompt_tokenizes(engine, path, expect):
    big = 16 * 2**20
    app = (simple_server.build_app(engine, shutdown_engine=False, max_body_bytes=big)
           if path == "/generate" else
           build_app(engine, ServerSettings(shutdown_engine=False, max_body_bytes=big)))
    srv = RunningServer(app)
    prompt = "The quick brown fox jumps over the lazy dog. " * (4 * 2**20 // 45)
    result: dict = {}

    def post() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=120) as c:
            result["r"] = c.post(path, json={"prompt": prompt, "max_tokens": 1})

    try:
        with httpx.Client(base_url=srv.base_url, timeout=10) as probe:
            assert probe.get("/health").status_code == 200  # connection warm
            worker = threading.Thread(target=post)
            worker.start()
            time.sleep(0.5)  # the body is sent and tokenization under way
            latencies = []
            while worker.is_alive():
                t0 = time.monotonic()
                assert probe.get("/health").status_code == 200
                latencies.append(time.monotonic() - t0)
                time.sleep(0.1)
            worker.join()
    finally:
        srv.stop()
    r = result["r"]
    assert r.status_code == expect, r.text[:300]
    if expect == 400:
        assert r.json()["error"]["param"] == "prompt"
    else:
        assert r.json()["count"] > 500_000
    print(f"{path}: {len(latencies)} /health probes during tokenization, "
          f"max {max(latencies):.3f} s")
    assert len(latencies) >= 5, "the request ended too soon to measure anything"
    assert max(latencies) < 1.0
