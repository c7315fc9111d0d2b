"""The server's edge: API key, failed-authentication limit, per-address rate limit, trusted
X-Forwarded-For, bounded bucket tables, and /metrics labels. In-process ASGI: most tests put
the middleware in front of a tiny app that echoes the client address; the last ones go
through build_app on the embedded default model."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from octavo.entrypoints.openai import middleware  # noqa: E402
from octavo.entrypoints.openai.middleware import (  # noqa: E402
    AuthRateLimitMiddleware,
    ForwardedForMiddleware,
    RateLimitMiddleware,
    SlidingWindows,
)
from tests.running_server import openai_http_library  # noqa: E402

httpx = openai_http_library(openai)

KEY = "sekret-key"


async def echo_client(scope, receive, send):
    """The app behind the middleware: answers 200 with the client address it was given."""
    body = json.dumps({"client": scope["client"][0]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def call(app, client: str = "1.1.1.1", path: str = "/v1/models",
               key: str | None = None, headers: dict | None = None):
    headers = dict(headers or {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    transport = httpx.ASGITransport(app=app, client=(client, 4242))
    async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as c:
        return await c.get(path, headers=headers)


def run(coro):
    return asyncio.run(coro)


def test_key_checked_in_constant_time_and_missing_header_is_401(monkeypatch):
    seen = []
    real = middleware.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(middleware.hmac, "compare_digest", spy)
    app = AuthRateLimitMiddleware(echo_client, api_key=KEY)

    async def main():
        assert (await call(app)).status_code == 401  # no Authorization header
        assert (await call(app, key="wrong")).status_code == 401
        assert (await call(app, key=KEY[:-1])).status_code == 401  # a prefix is not the key
        basic = await call(app, headers={"Authorization": f"Basic {KEY}"})
        assert basic.status_code == 401
        assert basic.json()["error"]["code"] == 401
        odd = await call(app, headers={"Authorization": b"Bearer \xff\xfe"})
        assert odd.status_code == 401  # not ASCII: refused, not a crash
        assert (await call(app, key=KEY)).status_code == 200
        assert (await call(app, path="/health")).status_code == 200  # probes need no key

    run(main())
    assert seen and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in seen)
    assert (KEY.encode(), KEY.encode()) in seen and (b"", KEY.encode()) in seen


def test_failed_authentications_are_limited_per_address():
    app = AuthRateLimitMiddleware(echo_client, api_key=KEY, max_auth_failures=10)

    async def main():
        for _ in range(10):
            assert (await call(app, client="6.6.6.6", key="guess")).status_code == 401
        # Locked out for the rest of the minute, the right key included.
        r = await call(app, client="6.6.6.6", key=KEY)
        assert r.status_code == 429
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert "failed authentications" in r.json()["error"]["message"]
        assert (await call(app, client="6.6.6.6", key="guess")).status_code == 429
        # Other addresses are not affected; nor are probes.
        assert (await call(app, client="7.7.7.7", key=KEY)).status_code == 200
        assert (await call(app, client="6.6.6.6", path="/health")).status_code == 200

    run(main())
    assert len(app.failures._hits["6.6.6.6"]) == 10  # refusals are not counted as failures


def test_spoofed_forwarded_for_is_ignored_by_default():
    auth = AuthRateLimitMiddleware(echo_client, api_key=KEY, max_auth_failures=3)
    # The server always puts ForwardedForMiddleware in front; with no trusted proxy it is a
    # no-op, so the peer address counts whatever the header says.
    app = ForwardedForMiddleware(auth, None)

    async def main():
        for i in range(3):
            r = await call(app, client="6.6.6.6", key="guess",
                           headers={"X-Forwarded-For": f"10.0.0.{i}"})
            assert r.status_code == 401
        r = await call(app, client="6.6.6.6", key=KEY,
                       headers={"X-Forwarded-For": "10.0.0.99"})
        assert r.status_code == 429
        r = await call(ForwardedForMiddleware(echo_client, None), client="6.6.6.6",
                       headers={"X-Forwarded-For": "10.0.0.99"})
        assert r.json()["client"] == "6.6.6.6"

    run(main())


def test_forwarded_for_honoured_only_from_listed_proxies():
    async def client_seen(trusted, peer, xff):
        r = await call(ForwardedForMiddleware(echo_client, trusted), client=peer,
                       headers={} if xff is None else {"X-Forwarded-For": xff})
        return r.json()["client"]

    async def main():
        # A listed proxy: the right-most address it did not write itself.
        assert await client_seen("10.0.0.1", "10.0.0.1", "5.5.5.5") == "5.5.5.5"
        assert await client_seen("10.0.0.1", "10.0.0.1", "6.6.6.6, 5.5.5.5") == "5.5.5.5"
        # A chain of trusted proxies (a network) is walked from the right.
        assert await client_seen("10.0.0.0/8, 192.168.1.1", "192.168.1.1",
                                 "6.6.6.6, 5.5.5.5, 10.2.3.4") == "5.5.5.5"
        assert await client_seen("10.0.0.1", "10.0.0.1", "10.0.0.1") == "10.0.0.1"
        assert await client_seen("10.0.0.1", "10.0.0.1", None) == "10.0.0.1"
        # Not a listed proxy: the header is the client's own text.
        assert await client_seen("10.0.0.1", "10.0.0.2", "5.5.5.5") == "10.0.0.2"
        assert await client_seen("", "10.0.0.2", "5.5.5.5") == "10.0.0.2"
        # "*" trusts every peer and every hop (uvicorn's meaning), so the left-most entry:
        # only for a proxy that overwrites the header.
        assert await client_seen("*", "8.8.8.8", "6.6.6.6, 5.5.5.5") == "6.6.6.6"
        # Canonical and bounded, since the proxy only relays what the client wrote.
        assert await client_seen("*", "8.8.8.8", "x" * 5000) == "x" * 64
        assert await client_seen("*", "8.8.8.8", "2001:DB8::1") == "2001:db8::1"

    run(main())
    # Per address behind the proxy: two clients get two buckets.
    limited = ForwardedForMiddleware(AuthRateLimitMiddleware(echo_client, rate_limit=1),
                                     "10.0.0.1")

    async def two_clients():
        for xff in ("5.5.5.5", "6.6.6.6"):
            r = await call(limited, client="10.0.0.1", headers={"X-Forwarded-For": xff})
            assert r.status_code == 200
        r = await call(limited, client="10.0.0.1", headers={"X-Forwarded-For": "5.5.5.5"})
        assert r.status_code == 429

    run(two_clients())


def test_made_up_bearer_tokens_do_not_get_fresh_buckets():
    app = AuthRateLimitMiddleware(echo_client, api_key=None, rate_limit=3)

    async def main():
        for i in range(3):
            assert (await call(app, key=f"token-{i}")).status_code == 200
        r = await call(app, key="yet-another-token")
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
        assert (await call(app)).status_code == 429
        assert (await call(app, client="2.2.2.2", key="token-0")).status_code == 200

    run(main())
    assert set(app.requests._hits) == {"1.1.1.1", "2.2.2.2"}


def test_bucket_tables_are_pruned():
    # Bounded: a flood of distinct addresses keeps at most max_keys buckets, newest kept.
    table = SlidingWindows(window=60.0, max_keys=100)
    for i in range(5000):
        assert table.hit(f"addr-{i}", limit=5) is None
    assert len(table) == 100 and "addr-4999" in table._hits and "addr-0" not in table._hits
    # Stale: buckets whose hits all left the window go as new hits arrive.
    table = SlidingWindows(window=0.05, max_keys=100)
    for i in range(50):
        table.hit(f"addr-{i}")
    time.sleep(0.1)
    table.hit("fresh")
    assert list(table._hits) == ["fresh"]
    # Through the middleware, both tables.
    app = AuthRateLimitMiddleware(echo_client, api_key=KEY, rate_limit=5, max_clients=20)

    async def main():
        for i in range(200):
            await call(app, client=f"10.1.{i // 250}.{i % 250}", key=KEY if i % 2 else "bad")

    run(main())
    assert len(app.requests) <= 20 and len(app.failures) <= 20


def test_rate_limit_middleware_as_in_the_guide():
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/ping")
    async def ping():
        return {"ok": True}

    app.add_middleware(RateLimitMiddleware, requests_per_minute=2)

    async def main():
        assert (await call(app, path="/v1/ping")).status_code == 200
        assert (await call(app, path="/v1/ping")).status_code == 200
        r = await call(app, path="/v1/ping")
        assert r.status_code == 429 and "2 requests per minute" in r.json()["error"]["message"]

    run(main())
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimitMiddleware(echo_client, requests_per_minute=0)


def test_new_flags_parse_and_are_validated():
    from octavo.entrypoints.openai.api_server import make_arg_parser, unsupported_flags

    p = make_arg_parser()
    args = p.parse_args([])
    assert args.forwarded_allow_ips is None and args.shutdown_timeout == 30
    assert unsupported_flags(args) == []
    args = p.parse_args(["--forwarded-allow-ips", "10.0.0.1, 192.168.0.0/16,*",
                         "--shutdown-timeout", "2.5"])
    assert unsupported_flags(args) == [] and args.shutdown_timeout == 2.5
    bad = unsupported_flags(p.parse_args(["--forwarded-allow-ips", "10.0.0.1,proxy.local",
                                          "--shutdown-timeout", "-1"]))
    assert len(bad) == 2 and "--shutdown-timeout" in bad[0] and "proxy.local" in bad[1]


def test_metrics_label_is_not_a_filesystem_path():
    from octavo.metrics.prometheus import PrometheusStatLogger, metrics_model_name

    assert metrics_model_name("/srv/models/llama-3-8b/", "/srv/models/llama-3-8b/") == \
        "llama-3-8b"
    assert metrics_model_name("/m/q4.gguf", "/m/q4.gguf") == "q4.gguf"
    # A name the user chose stays, slashes and all.
    assert metrics_model_name("meta-llama/Llama-3-8B", "/srv/models/llama-3-8b") == \
        "meta-llama/Llama-3-8B"
    sched = SimpleNamespace(running=[], waiting=[], kv=SimpleNamespace(
        usage=0.0, prefix_queries=0, prefix_hits=0), preemptions_by_mode={"recompute": 0},
        swap=SimpleNamespace(req_to_cpu_blocks={}))
    fake = SimpleNamespace(scheduler=sched, config=SimpleNamespace(
        model_config=SimpleNamespace(model="/home/alice/models/smol")))
    text = PrometheusStatLogger(fake, "/home/alice/models/smol").render().decode()
    assert 'model_name="smol"' in text and "/home/alice" not in text


# ------------------------------------------------------------- through build_app
@pytest.fixture(scope="module")
def engine():
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(EngineArgs(max_model_len=512, max_num_seqs=64))
    yield llm
    llm.shutdown()


def test_server_app_auth_and_metrics_label(engine):
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app

    mc = engine.model_config
    app = build_app(engine, ServerSettings(api_key=KEY, shutdown_engine=False))
    # As the launcher serves it: behind ForwardedForMiddleware, here with a listed proxy.
    served = ForwardedForMiddleware(app, "10.0.0.1")
    xff = {"X-Forwarded-For": "5.5.5.5"}

    async def main():
        r = await call(served, client="10.0.0.1", key="wrong", headers=xff)
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        for _ in range(9):
            await call(served, client="10.0.0.1", key="wrong", headers=xff)
        r = await call(served, client="10.0.0.1", key=KEY, headers=xff)
        assert r.status_code == 429  # 5.5.5.5 is locked out ...
        r = await call(served, client="10.0.0.1", key=KEY,
                       headers={"X-Forwarded-For": "5.5.5.6"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == mc.served_model_name
        metrics = (await call(served, path="/metrics")).text  # ... the proxy is not
        assert f'model_name="{mc.served_model_name}"' in metrics
        assert mc.model not in metrics  # the checkpoint's path is nowhere in the labels

    run(main())
