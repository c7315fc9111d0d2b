"""The seed's operations section: ``--metrics-port 9090 --metric-interval 30`` and
``app.add_middleware(RateLimitMiddleware, requests_per_minute=100)``.

--metrics-port is checked through run_server itself, in process: the engine comes from a tiny
checkpoint and uvicorn's serve is replaced by a function that scrapes both ports while the
server would be running (a real server subprocess would spend most of its time loading)."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints import launcher  # noqa: E402
from octavo.entrypoints.openai import api_server  # noqa: E402
from octavo.metrics.log_stats import LoggingStatLogger  # noqa: E402
from tests.running_server import free_port, openai_http_library  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

httpx = openai_http_library(openai)


@pytest.fixture(scope="module")
def allm(tmp_path_factory):
    path = make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_ops")))
    engine = AsyncLLM.from_engine_args(EngineArgs(model=path, dtype="float32",
                                                  skip_tokenizer_init=True, max_model_len=128))
    yield engine
    engine.shutdown()


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return _samples(text.decode())


def _samples(text: str) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name.startswith("octavo:")}


async def _asgi(app, method: str, path: str, **kw):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, **kw)


@pytest.fixture
def use_engine(monkeypatch, allm):
    """run_server builds its engine from the flags: hand it the test's engine instead. And it
    freezes the process's heap (gc.freeze) once serving: not pytest's, whose later garbage
    would never be collected."""
    monkeypatch.setenv("OCTAVO_FREEZE_STARTUP_HEAP", "0")
    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(lambda cls, args: allm))
    yield
    allm.stat_loggers[:] = [sl for sl in allm.stat_loggers
                            if not isinstance(sl, LoggingStatLogger)]


def test_metrics_port_serves_the_same_registry_as_the_main_port(monkeypatch, use_engine,
                                                               allm):
    port = free_port()
    seen = {}

    def fake_serve(app, engine, **kwargs):
        assert engine is allm and kwargs["port"] == 0
        assert kwargs["sock"].getsockname()[0] == "127.0.0.1"  # bound before the engine
        assert any(isinstance(sl, LoggingStatLogger) and sl.interval == 30.0
                   for sl in engine.stat_loggers), "--metric-interval 30 not attached"
        seen["before"] = scrape(port)

        async def work():
            r = await _asgi(app, "POST", "/v1/completions", json={
                "prompt": [1, 2, 3, 4], "max_tokens": 5, "temperature": 0,
                "ignore_eos": True})
            assert r.status_code == 200, r.text
            # The engine thread counts a finished request just after handing out its output.
            for _ in range(500):
                text = (await _asgi(app, "GET", "/metrics")).text
                if "octavo:request_success_total" in _samples(text):
                    return text
                await asyncio.sleep(0.01)
            raise AssertionError("the request was never counted")

        seen["main"] = _samples(asyncio.run(work()))
        seen["separate"] = scrape(port)
        return 0

    monkeypatch.setattr(launcher, "serve", fake_serve)
    args = api_server.make_arg_parser().parse_args([
        "--host", "127.0.0.1", "--port", "0", "--metrics-port", str(port),
        "--metric-interval", "30"])
    assert api_server.run_server(args) == 0
    before, main, separate = seen["before"], seen["main"], seen["separate"]
    assert "octavo:num_requests_running" in before and "octavo:kv_cache_usage_perc" in before
    # One registry behind both ports: the same families, the request counted on both.
    assert set(main) == set(separate)
    gen = "octavo:generation_tokens_total"
    assert main[gen] == separate[gen] == before[gen] + 5
    # The metrics server stops with the server.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port)


def test_metrics_port_in_use_is_a_clear_error(monkeypatch, use_engine, allm, capsys):
    monkeypatch.setattr(launcher, "serve", lambda *a, **k: pytest.fail("served anyway"))
    stopped = []  # run_server stops the engine it started (the module's: only recorded)
    monkeypatch.setattr(allm, "shutdown", lambda *a, **k: stopped.append(True))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = api_server.make_arg_parser().parse_args(
            ["--host", "127.0.0.1", "--port", "0", "--metrics-port", str(port)])
        assert api_server.run_server(args) == 2
    assert f"--metrics-port {port}" in capsys.readouterr().err
    assert stopped == [True]


def test_run_server_in_process_left_the_heap_unfrozen():
    """Guard for the fixture above: after the in-process run_server tests nothing of
    pytest's heap is frozen."""
    import gc

    assert gc.get_freeze_count() == 0


def test_no_metrics_port_no_extra_server(monkeypatch, use_engine):
    started = []
    monkeypatch.setattr(api_server, "start_metrics_server", lambda *a: started.append(a))
    monkeypatch.setattr(launcher, "serve", lambda *a, **k: 0)
    assert api_server.run_server(api_server.make_arg_parser().parse_args(
        ["--disable-log-stats", "--port", "0"])) == 0
    assert started == []


def test_servers_listen_on_loopback_unless_asked(monkeypatch, use_engine):
    """Everything Octavo starts listens on 127.0.0.1 by default: the OpenAI server, its
    --metrics-port server and the simple server; --host moves them."""
    from octavo.entrypoints import api_server as simple_server

    hosts = []
    monkeypatch.setattr(launcher, "serve", lambda *a, **k: hosts.append(k["host"]) or 0)
    port = free_port()
    bound = []
    real_start = api_server.start_metrics_server

    def start_and_record(app, host, p):
        server = real_start(app, host, p)
        bound.append(server.server_address[0])
        return server

    monkeypatch.setattr(api_server, "start_metrics_server", start_and_record)
    assert api_server.run_server(api_server.make_arg_parser().parse_args(
        ["--disable-log-stats", "--port", "0", "--metrics-port", str(port)])) == 0
    assert hosts == ["127.0.0.1"] and bound == ["127.0.0.1"]
    assert api_server.run_server(api_server.make_arg_parser().parse_args(
        ["--disable-log-stats", "--host", "0.0.0.0", "--port", "0"])) == 0
    assert hosts[-1] == "0.0.0.0"
    monkeypatch.setattr(launcher, "serve", lambda *a, **k: hosts.append(k["host"]) or 0)
    assert simple_server.run_server(simple_server.make_parser().parse_args(
        ["--disable-log-stats", "--port", "0"])) == 0
    assert hosts[-1] == "127.0.0.1"


@pytest.mark.parametrize("server", ["openai", "simple"])
@pytest.mark.parametrize("flags, says", [
    ("busy", "Address already in use"),
    (["--port", "70000"], "port must be 0-65535, got 70000"),
    (["--port", "-1"], "port must be 0-65535, got -1"),
    (["--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid"),
])
def test_a_port_that_cannot_be_had_is_said_before_the_engine_loads(monkeypatch, capsys, server,
                                                                   flags, says):
    """The socket is bound before the engine starts (minutes for a large model): a port in
    use or out of range, or a host that does not resolve, is an error at once, exit 2, with
    no engine started (was a traceback, or uvicorn's error, after the model loaded)."""
    from octavo.entrypoints import api_server as simple_server

    module = api_server if server == "openai" else simple_server
    monkeypatch.setattr(module, "start_engine", lambda args: pytest.fail("engine started"))
    parse = (api_server.make_arg_parser() if server == "openai"
             else simple_server.make_parser()).parse_args
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if flags == "busy":
            flags = ["--port", str(busy.getsockname()[1])]
        assert module.run_server(parse(flags)) == 2
    err = capsys.readouterr().err
    assert "octavo: error: cannot listen on" in err and says in err, err


def test_the_bound_socket_refuses_connections_until_served():
    """Bound, not listening: a client that comes while the engine loads is refused, not left
    hanging in a backlog."""
    from octavo.entrypoints.launcher import listen_socket

    sock = listen_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(sock.getsockname(), timeout=5).close()
    finally:
        sock.close()


async def _hit(app, n: int) -> list[int]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return [(await client.get("/v1/models")).status_code for _ in range(n)]


def test_rate_limit_middleware_as_in_the_seed(allm):
    """The seed's line on the server's own app: the 101st request within a minute is a 429
    with Retry-After, in OpenAI's error shape."""
    from octavo.entrypoints.openai.api_server import RateLimitMiddleware, ServerSettings

    app = api_server.build_app(allm, ServerSettings(shutdown_engine=False))
    app.add_middleware(
        RateLimitMiddleware,
        requests_per_minute=100
    )
    statuses = asyncio.run(_hit(app, 101))
    assert statuses == [200] * 100 + [429]

    async def one_more():
        return await _asgi(app, "GET", "/v1/models")

    r = asyncio.run(one_more())
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["type"] == "RateLimitError"
    # Probes are never limited.
    assert asyncio.run(_asgi(app, "GET", "/health")).status_code == 200
