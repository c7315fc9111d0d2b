"""Graceful shutdown of both servers, as real subprocesses with streams in flight.

SIGTERM: listeners close, in-flight requests drain for at most --shutdown-timeout seconds,
the rest end with an in-band error and ``data: [DONE]`` (or an NDJSON error line), exit 0. A
second signal (SIGTERM or SIGINT) ends the drain at once, with the same endings. Three server
processes in all (a start takes ~10 s on an idle 2-core machine, ~35 s on a loaded one).

The client is a few lines of raw asyncio HTTP/1.0 (the server then frames the body by closing
the connection), so what a stream received is exactly what is checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.running_server import free_port, wait_until_healthy  # noqa: E402

NUM_STREAMS = 100
PROMPT = "Once upon a time"


class Server:
    """``python -m <module> --port <free> ...`` with its output in a temporary file."""

    def __init__(self, module: str, *flags: str) -> None:
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port),
             "--max-model-len", "256", "--max-num-seqs", "128", "--uvicorn-log-level",
             "warning", *flags],
            stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ))
        if not wait_until_healthy(self.port, 180, alive=lambda: self.proc.poll() is None,
                                  interval=0.2):
            self.kill()
            pytest.fail(f"the server did not start:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture(scope="module", autouse=True)
def _cpu_kernels_built():
    # A server compiles Octavo's CPU kernels at its first step when torch's extension cache is
    # cold (minutes on a busy machine) under a lock file that stays behind if the process is
    # killed mid-build, blocking every later engine. Build here, before any server starts, so
    # streams do not wait for a compiler and a server killed at teardown never holds the lock.
    try:
        from octavo.kernels.cpu import load
    except ImportError:  # no torch here: the servers will say so themselves
        return
    load()


@pytest.fixture
def servers():
    started: list[Server] = []

    def start(module: str, *flags: str) -> Server:
        started.append(Server(module, *flags))
        return started[-1]

    yield start
    for srv in started:
        srv.kill()


@dataclass
class Stream:
    status: int | None = None
    events: list = field(default_factory=list)  # parsed JSON objects, or the text "[DONE]"
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False


async def post_stream(port: int, path: str, body: dict, stream: Stream,
                      sse: bool = True) -> Stream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.0\r\nHost: test\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        stream.status = int(head.split(b" ", 2)[1])
        async for raw in reader:  # until the server closes the connection
            line = raw.decode().strip()
            if sse:
                if not line.startswith("data: "):
                    continue
                line = line[len("data: "):]
            if not line:
                continue
            try:
                stream.events.append(json.loads(line))
            except ValueError:  # "[DONE]", or anything unexpected, kept as text
                stream.events.append(line)
            stream.first.set()
    finally:
        stream.done = True
        stream.first.set()  # an error answer has no event: let the waiter see it
        writer.close()
    return stream


def _completion(max_tokens: int) -> dict:
    return {"model": "SmolLM2-135M-Instruct", "prompt": PROMPT, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}


async def _start_streams(srv: Server, bodies: list[dict], path="/v1/completions",
                         sse: bool = True) -> tuple[list[Stream], list[asyncio.Task]]:
    streams = [Stream() for _ in bodies]
    tasks = [asyncio.create_task(post_stream(srv.port, path, body, s, sse))
             for body, s in zip(bodies, streams)]
    # In flight: every stream has its first event (prefill done, decoding under way).
    try:
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 180)
    except asyncio.TimeoutError:
        waiting = [(s.status, s.events[:1]) for s in streams if not s.first.is_set()]
        pytest.fail(f"{len(waiting)} stream(s) without a first event: {waiting[:5]}")
    return streams, tasks


def _assert_error_endings(streams: list[Stream]) -> None:
    for s in streams:
        assert s.status == 200 and len(s.events) >= 3, s
        assert s.events[-1] == "[DONE]", s.events[-3:]
        err = s.events[-2]["error"]
        assert err["code"] == 503 and "shut down" in err["message"], err
        # It was cut short: no choice finished.
        assert not any(c.get("finish_reason") for e in s.events[:-2] for c in e["choices"])


def _wait_exit(srv: Server, timeout: float) -> int:
    try:
        return srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {timeout} s:\n{srv.output()}")


def test_sigterm_short_timeout_ends_streams_with_error_and_done(servers):
    timeout = 2.0
    srv = servers("octavo.entrypoints.openai.api_server", "--shutdown-timeout", str(timeout))

    async def main():
        streams, tasks = await _start_streams(srv, [_completion(240)] * NUM_STREAMS)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout + 20)
        return streams, t0, time.monotonic() - t0

    streams, t0, ended = asyncio.run(main())
    _assert_error_endings(streams)
    assert _wait_exit(srv, 20) == 0, srv.output()
    exited = time.monotonic() - t0
    # The drain waited the timeout (the streams had ~200 tokens to go), then no longer; the
    # margins are for a loaded 2-core machine (ending and exiting take ~1 s and ~4 s there).
    assert timeout - 0.5 <= ended <= timeout + 10, ended
    assert exited <= timeout + 20, exited


def test_drain_finishes_streams_refuses_connections_and_a_second_signal_ends_the_rest(servers):
    """One server for both: half the streams are short (they finish during the drain), half
    run for minutes (the second SIGTERM ends them)."""
    srv = servers("octavo.entrypoints.openai.api_server", "--shutdown-timeout", "300")
    half = NUM_STREAMS // 2

    async def main():
        streams, tasks = await _start_streams(
            srv, [_completion(12)] * half + [_completion(240)] * half)
        srv.proc.send_signal(signal.SIGTERM)
        refused_at = None
        for _ in range(100):  # the listener closes at uvicorn's next tick (0.1 s)
            try:
                _, w = await asyncio.open_connection("127.0.0.1", srv.port)
                w.close()
            except (ConnectionRefusedError, ConnectionResetError):
                # A connection that reached the backlog as the listener closed is reset
                # rather than refused: the listener is gone either way.
                refused_at = sum(s.done for s in streams)
                break
            await asyncio.sleep(0.02)
        await asyncio.wait_for(asyncio.gather(*tasks[:half]), 120)
        assert not any(s.done for s in streams[half:])  # still draining
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*tasks[half:]), 30)
        return streams, refused_at, time.monotonic() - t0

    streams, done_when_refused, ended = asyncio.run(main())
    assert done_when_refused is not None, "new connections were still accepted"
    assert done_when_refused < half  # refused while the drain was under way
    for s in streams[:half]:
        assert s.status == 200 and s.events[-1] == "[DONE]", s.events[-3:]
        assert not any("error" in e for e in s.events[:-1]), s.events[-3:]
        assert s.events[-2]["choices"][0]["finish_reason"] == "length"
    _assert_error_endings(streams[half:])
    assert ended < 10, ended
    assert _wait_exit(srv, 20) == 0, srv.output()


def test_drain_ends_as_soon_as_in_flight_requests_finish():
    """In-process, no engine: the drain waits for the requests, not the whole timeout, then
    shuts the engine down; requests arriving meanwhile get 503."""
    import uvicorn

    from octavo.entrypoints.launcher import DrainGate, GracefulServer

    class FakeEngine:
        shutdowns = 0

        def __init__(self) -> None:
            self.fatal_callbacks = []  # the server registers its exit-on-engine-death here

        def shutdown(self) -> None:
            self.shutdowns += 1

    class FakeLifespan:
        async def shutdown(self) -> None:
            pass

    async def main():
        gate = DrainGate(app=None)
        engine = FakeEngine()
        srv = GracefulServer(uvicorn.Config(gate), engine, gate, shutdown_timeout=60)
        srv.servers, srv.lifespan = [], FakeLifespan()
        request = asyncio.create_task(asyncio.sleep(0.3))
        srv.server_state.tasks.add(request)
        request.add_done_callback(srv.server_state.tasks.discard)
        srv.handle_exit(signal.SIGTERM, None)
        sent = []

        async def send(msg):
            sent.append(msg)

        await gate({"type": "http", "path": "/v1/completions"}, None, send)
        assert sent[0]["status"] == 503 and (b"connection", b"close") in sent[0]["headers"]
        t0 = time.monotonic()
        await srv.shutdown()
        assert time.monotonic() - t0 < 3
        assert request.done() and not request.cancelled()
        assert engine.shutdowns == 1 and not srv.forced

    asyncio.run(main())


@pytest.mark.slow  # the OpenAI server's two signal tests cover the shared drain path in CI
def test_simple_server_sigterm_then_sigint_ends_ndjson_streams_with_error_line(servers):
    """The simple server, and SIGINT as the second signal (Ctrl-C after a SIGTERM)."""
    srv = servers("octavo.entrypoints.api_server", "--shutdown-timeout", "120")
    body = {"prompt": PROMPT, "max_tokens": 240, "ignore_eos": True, "stream": True}

    async def main():
        streams, tasks = await _start_streams(srv, [body] * 10, path="/generate", sse=False)
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert not any(s.done for s in streams)  # draining, still streaming
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return streams, time.monotonic() - t0

    streams, ended = asyncio.run(main())
    for s in streams:
        assert s.status == 200 and "text" in s.events[0]
        assert all("text" in e for e in s.events[:-1]), s.events[-2:]
        err = s.events[-1]["error"]
        assert err["code"] == 503 and "shut down" in err["message"], err
    assert ended < 10, ended
    assert _wait_exit(srv, 20) == 0, srv.output()
