"""Hostile requests that ask the servers for too much (found by the fuzz campaign): lists of
a million items (stop strings, prompts, bad words, token ids, chat messages), a body
trickled a byte at a time (slowloris), a Content-Length that is no number.

Each is refused up front in OpenAI's error shape, naming the field and the limit, and leaves
the server serving a normal request with every KV block back in the pool. Offline
``LLM.generate`` takes any number of prompts (tests/test_offline_api.py): these are server
limits (octavo/entrypoints/request_limits.py, --request-body-timeout).
"""

from __future__ import annotations

import asyncio
import json
import socket
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
from octavo.entrypoints.request_limits import (  # noqa: E402
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_CHOICES,
    MAX_DETOKENIZE_TOKENS,
    MAX_MESSAGE_EXTRA_VALUES,
    MAX_MESSAGES,
    MAX_PROMPTS,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOOL_VALUES,
    json_values,
    message_extra_values,
)
from tests.running_server import RunningServer, wait_idle  # noqa: E402
from tests.server_apps import in_process_engine  # noqa: E402
from tests.test_hostile_server import (  # noqa: E402
    CHAT,
    COMPLETION,
    GENERATE,
    NORMAL,
    VOCAB,
    _client,
    _post,
    expect_refused,
)

# Each test waits for the engine to go idle after it (tests/server_apps.py).
pytestmark = pytest.mark.usefixtures("settle_engine")


@pytest.fixture(scope="module")
def engine():
    yield from in_process_engine(512, 64)


@pytest.fixture
def generate_calls(engine, monkeypatch) -> list[str]:
    """The request ids the servers hand the engine (AsyncLLM.start_request, or generate),
    in order."""
    calls: list[str] = []
    real = engine.start_request

    async def counting(prompt, params, request_id, **kw):
        calls.append(request_id)
        stream = real(prompt, params, request_id, **kw)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    monkeypatch.setattr(engine, "generate", counting)
    monkeypatch.setattr(engine, "start_request", counting)
    return calls


# ------------------------------------------------------------------ too many items
_MESSAGE = {"role": "user", "content": "hi"}
# field -> (a value over the limit, the limit)
_LISTS = {
    "stop": (["x"] * 10**6, MAX_STOP),
    "bad_words": ([f"w{i}" for i in range(MAX_BAD_WORDS + 1)], MAX_BAD_WORDS),
    "stop_token_ids": ([1] * 100_000, MAX_STOP_TOKEN_IDS),
    "allowed_token_ids": ([1] * (MAX_ALLOWED_TOKEN_IDS + 1), MAX_ALLOWED_TOKEN_IDS),
}
_TOO_MANY = [
    *[("openai", "/v1/completions", {**COMPLETION, f: v}, f, len(v), lim)
      for f, (v, lim) in _LISTS.items()],
    ("openai", "/v1/completions", {**COMPLETION, "prompt": ["hi"] * 100_000}, "prompt",
     100_000, MAX_PROMPTS),
    ("openai", "/v1/completions", {**COMPLETION, "prompt": [[1, 2]] * 100_000}, "prompt",
     100_000, MAX_PROMPTS),
    *[("openai", "/v1/chat/completions", {**CHAT, f: v}, f, len(v), lim)
      for f, (v, lim) in _LISTS.items()],
    ("openai", "/v1/chat/completions", {**CHAT, "messages": [_MESSAGE] * (MAX_MESSAGES + 1)},
     "messages", MAX_MESSAGES + 1, MAX_MESSAGES),
    ("openai", "/tokenize", {"messages": [_MESSAGE] * 100_000}, "messages", 100_000,
     MAX_MESSAGES),
    ("openai", "/detokenize", {"tokens": [1] * (MAX_DETOKENIZE_TOKENS + 1)}, "tokens",
     MAX_DETOKENIZE_TOKENS + 1, MAX_DETOKENIZE_TOKENS),
    *[("simple", "/generate", {**GENERATE, f: v}, f, len(v), lim)
      for f, (v, lim) in _LISTS.items()],
    # stop strings too long together (each is searched for after every token)
    ("openai", "/v1/completions", {**COMPLETION, "stop": ["y" * 8000] * 16}, "stop", 128000,
     MAX_STOP_CHARS),
    ("openai", "/v1/chat/completions", {**CHAT, "stop": "y" * 70000}, "stop", 70000,
     MAX_STOP_CHARS),
    ("simple", "/generate", {**GENERATE, "stop": ["y" * 8000] * 16}, "stop", 128000,
     MAX_STOP_CHARS),
]


@pytest.mark.parametrize("app_name, path, body, param, count, limit", [
    pytest.param(*case, id=f"{case[1]}:{case[3]}") for case in _TOO_MANY])
def test_too_many_items_refused_up_front(engine, apps, generate_calls, app_name, path, body,
                                         param, count, limit):
    t0 = time.monotonic()
    err = expect_refused(engine, apps[app_name], path, body, param)
    assert f"{count} " in err["message"] and f"limit of {limit} per request" in err["message"]
    assert err["message"].startswith(f"{param}: "), err
    # Nothing of the refused request reached the engine: only the normal one that followed.
    assert len(generate_calls) == (0 if path in ("/tokenize", "/detokenize") else 1), generate_calls
    print(f"{path} {param}: refused and served again in {time.monotonic() - t0:.2f} s")


_TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize("extra", [
    {"extra": [[0]] * 1_000_000},  # one field of nested lists (~3 s in the template's walk)
    {"tool_calls": [_TOOL_CALL] * 9000},  # ~70k values: past the limit
    {f"k{i}": i for i in range(MAX_MESSAGE_EXTRA_VALUES)},  # many small fields
])
def test_message_fields_past_the_value_limit_refused(engine, apps, generate_calls, path,
                                                     extra):
    """Fields besides role and content reach the chat template, which walks every value:
    more than MAX_MESSAGE_EXTRA_VALUES across a request's messages is a 400 naming messages,
    before the messages are validated or rendered."""
    body = {"messages": [{"role": "assistant", "content": None, **extra}]}
    if path != "/tokenize":
        body = {**CHAT, **body}
    err = expect_refused(engine, apps["openai"], path, body, "messages")
    assert f"limit of {MAX_MESSAGE_EXTRA_VALUES} JSON values" in err["message"], err
    assert len(generate_calls) == (0 if path == "/tokenize" else 1), generate_calls


def test_tools_past_the_value_limit_refused(engine, apps, generate_calls):
    """Tool definitions reach the chat template too (walked value by value), tool_choice
    auto included: more than MAX_TOOL_VALUES is a 400 naming tools."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    err = expect_refused(engine, apps["openai"], "/v1/chat/completions",
                         {**CHAT, "tools": [tool] * 10_000}, "tools")
    assert f"limit of {MAX_TOOL_VALUES} JSON values" in err["message"], err
    assert len(generate_calls) == 1


def test_json_values_counts_every_value_and_stops_past_the_limit():
    assert json_values([{"a": [1, 2]}], 100) == 5  # the dict, its key, the list, 1, 2
    assert json_values([[0] * 10], 5) == 6  # stopped at the list: not walked
    assert json_values(["x"] * 7, 5) == 6
    assert message_extra_values([{"role": "user", "content": "x", "name": "n",
                                  "tool_calls": [{"id": "1"}]}], 100) == 7


def test_message_fields_within_the_value_limit_are_served(engine, apps):
    """A conversation's tool calls well inside the limit (a few thousand of them)."""
    calls = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": None, "tool_calls": [_TOOL_CALL] * 4000},
             {"role": "tool", "content": "ok", "tool_call_id": "c1"},
             {"role": "user", "content": "and?"}]

    async def go():
        async with _client(apps["openai"]) as c:
            return await _post(c, "/tokenize", {"messages": calls})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text[:300]
    assert r.json()["count"] > 0


_WORDS = [f"c{i:05d}" for i in range(MAX_CHOICES + 1)]
_BIG_SCHEMA = {"type": "string", "enum": ["x" * 100] * 3000}  # ~312k characters as JSON
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": _BIG_SCHEMA}}}}
_CONSTRAINTS = [
    ("openai", "/v1/completions", {**COMPLETION, "guided_choice": _WORDS}, "guided_choice",
     f"{MAX_CHOICES + 1} choices"),
    ("openai", "/v1/completions", {**COMPLETION, "structured_outputs": {"choice": _WORDS}},
     "structured_outputs", f"{MAX_CHOICES + 1} choices"),
    ("openai", "/v1/completions", {**COMPLETION, "guided_regex": "(ab|cd)" * 40_000},
     "guided_regex", "280000 characters"),
    ("openai", "/v1/chat/completions", {**CHAT, "guided_json": _BIG_SCHEMA}, "guided_json",
     "characters"),
    ("openai", "/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": _BIG_SCHEMA}}},
     "response_format", "characters"),
    ("openai", "/v1/chat/completions", {**CHAT, "tools": [_TOOL], "tool_choice": "required"},
     "tools", "characters"),
    ("simple", "/generate", {**GENERATE, "structured_outputs": {"grammar": "root ::= "
                                                                + '"a" ' * 70_000}},
     "structured_outputs", "characters"),
]


@pytest.mark.parametrize("app_name, path, body, param, says", [
    pytest.param(*case, id=f"{case[1]}:{case[3]}") for case in _CONSTRAINTS])
def test_constraints_too_big_to_compile_refused(engine, apps, generate_calls, app_name, path,
                                                body, param, says):
    """An output constraint is compiled on the worker that validates its request (200k
    choices: 22 s): more than MAX_CHOICES choices or MAX_CONSTRAINT_CHARS characters is a
    400 naming the field, before anything is compiled or queued."""
    err = expect_refused(engine, apps[app_name], path, body, param)
    assert says in err["message"] and "this server's limit" in err["message"], err
    assert len(generate_calls) == 1, generate_calls  # only the normal request after it


def test_a_constraint_at_the_limit_is_served(engine, apps):
    """MAX_CHOICES choices compile and constrain the output."""
    async def go():
        async with _client(apps["openai"]) as c:
            return await _post(c, "/v1/completions", {**COMPLETION, "max_tokens": 8,
                                                      "guided_choice": _WORDS[:MAX_CHOICES]})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["text"] in _WORDS[:MAX_CHOICES]


def test_lists_at_the_limit_are_served(engine, apps):
    """The caps leave room: every list at its limit is a normal request on both servers."""
    at_limit = {"stop": [f"zq{i}" for i in range(MAX_STOP)],
                "bad_words": [f"zq{i}" for i in range(MAX_BAD_WORDS)],
                "stop_token_ids": [VOCAB - 1] * MAX_STOP_TOKEN_IDS,
                "allowed_token_ids": [i % VOCAB for i in range(MAX_ALLOWED_TOKEN_IDS)]}

    async def main():
        for app, path, base in ((apps["openai"], "/v1/completions", COMPLETION),
                                (apps["openai"], "/v1/chat/completions", CHAT),
                                (apps["simple"], "/generate", GENERATE)):
            async with _client(app) as c:
                r = await _post(c, path, {**base, **at_limit})
                assert r.status_code == 200, (path, r.text[:300])

    asyncio.run(main())


def test_schema_states_the_list_limits(apps):
    schemas = apps["openai"].openapi()["components"]["schemas"]
    props = schemas["CompletionRequest"]["properties"]

    def max_items(spec: dict) -> list[int]:
        return [s["maxItems"] for s in spec.get("anyOf", [spec]) if "maxItems" in s]

    assert max_items(props["prompt"]) == [MAX_PROMPTS, MAX_PROMPTS]
    assert max_items(props["stop"]) == [MAX_STOP]
    assert max_items(props["bad_words"]) == [MAX_BAD_WORDS]
    assert max_items(props["stop_token_ids"]) == [MAX_STOP_TOKEN_IDS]
    assert max_items(props["allowed_token_ids"]) == [MAX_ALLOWED_TOKEN_IDS]
    assert max_items(schemas["ChatCompletionRequest"]["properties"]["messages"]) == [
        MAX_MESSAGES]


# ------------------------------------------------------------------ a body trickled in
def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """What the server sends until it closes the connection (True) or ``limit_s`` passes."""
    out = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset: the server closed while bytes were still on their way
            return out, True
        if not chunk:
            return out, True
        out += chunk
    return out, False


def _trickle(port: int, path: str, limit_s: float) -> tuple[float, bytes, bool]:
    """Send headers, then the body a byte every 0.05 s (never all of it) until the server
    answers. (seconds until the answer, the answer, whether the server closed)"""
    sock = socket.create_connection(("127.0.0.1", port), timeout=0.05)
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json"
                     f"\r\nContent-Length: 100000\r\n\r\n".encode())
        t0 = time.monotonic()
        answer = b""
        while not answer and time.monotonic() - t0 < limit_s:
            try:
                sock.sendall(b" ")
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # closed under us: the answer, if any, is still to read
                break
        elapsed = time.monotonic() - t0
        rest, closed = _read_until_closed(sock, limit_s)
        return elapsed, answer + rest, closed
    finally:
        sock.close()


@pytest.mark.parametrize("which", ["openai", "simple"])
def test_slow_body_is_a_408(engine, which):
    timeout = 0.5
    app = (build_app(engine, ServerSettings(shutdown_engine=False,
                                            request_body_timeout=timeout))
           if which == "openai" else
           simple_server.build_app(engine, shutdown_engine=False, request_body_timeout=timeout))
    path = "/v1/completions" if which == "openai" else "/generate"
    srv = RunningServer(app)
    try:
        elapsed, raw, closed = _trickle(srv.port, path, limit_s=10)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), raw[:300]
        assert b"content-type: application/json" in head.lower()
        assert b"connection: close" in head.lower()  # the rest of the body is never read
        assert closed, "the server kept the connection open"
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == 408 and err["type"] == "RequestTimeoutError"
        assert "0.5 s" in err["message"] and "--request-body-timeout" in err["message"]
        # The deadline is for the whole body, not between bytes (which came every 0.05 s).
        assert timeout <= elapsed < timeout + 3, elapsed
        with httpx.Client(base_url=srv.base_url, timeout=60) as c:
            assert c.get("/health").status_code == 200
            ok = c.post(path, json=NORMAL[path])
            assert ok.status_code == 200, ok.text
    finally:
        srv.stop()
    wait_idle(engine)
    pool = engine.engine.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_body_arriving_in_time_is_served(engine):
    """A body sent in pieces within the bound is read whole (the bound is not per read)."""
    app = build_app(engine, ServerSettings(shutdown_engine=False, request_body_timeout=5.0))
    raw = json.dumps(COMPLETION).encode()
    srv = RunningServer(app)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: "
                         b"application/json\r\nConnection: close\r\nContent-Length: "
                         + str(len(raw)).encode() + b"\r\n\r\n")
            for i in range(0, len(raw), 8):
                sock.sendall(raw[i:i + 8])
                time.sleep(0.02)
            answer, _ = _read_until_closed(sock, 30)
    finally:
        srv.stop()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


# ------------------------------------------------------------------ a broken Content-Length
@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3"])
def test_bad_content_length_then_serving(engine, apps, length):
    """uvicorn's HTTP parser (h11) refuses these before the app is called, with its own
    plain-text 400 ("Invalid HTTP request received."): no JSON body is possible without
    replacing uvicorn's protocol class. What the servers owe is the 400 and serving on."""
    srv = RunningServer(apps["openai"])
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: "
                         b"application/json\r\nContent-Length: " + length + b"\r\n\r\n{}")
            answer, _ = _read_until_closed(sock, 10)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
        with httpx.Client(base_url=srv.base_url, timeout=60) as c:
            ok = c.post("/v1/completions", json=COMPLETION)
            assert ok.status_code == 200, ok.text
    finally:
        srv.stop()
