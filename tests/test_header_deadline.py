"""A connection waiting for a request's head is closed after --request-header-timeout: one
that sends nothing, one that sends its headers a byte at a time (slowloris), one still
sending a body the server answered without reading. Requests whose head arrived are not
timed: a response streamed for longer than the deadline goes through, and so does the next
request of a kept-alive connection. Both of uvicorn's HTTP/1.1 protocols (h11, httptools)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import time

import pytest

pytest.importorskip("uvicorn")

from octavo.entrypoints.header_deadline import head_deadline_protocol  # noqa: E402
from tests.running_server import RunningServer  # noqa: E402

TIMEOUT = 0.5
PROTOCOLS = ["h11", pytest.param("httptools", marks=pytest.mark.skipif(
    importlib.util.find_spec("httptools") is None, reason="httptools is not installed"))]


async def app(scope, receive, send):
    """/slow streams 4 chunks 0.3 s apart; anything else answers "ok" without reading a
    body."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    if scope["path"] == "/slow":
        for i in range(4):
            await send({"type": "http.response.body", "body": b"%d" % i, "more_body": True})
            await asyncio.sleep(0.3)
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=PROTOCOLS)
def server(request):
    srv = RunningServer(app, http=head_deadline_protocol(TIMEOUT, request.param))
    yield srv
    srv.stop()


def _closed_within(sock: socket.socket, limit_s: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock`` (None if it did not within ``limit_s``),
    sending a byte of ``trickle`` every 0.05 s meanwhile."""
    sock.settimeout(0.05)
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < limit_s:
        try:
            if i < len(trickle):
                sock.sendall(trickle[i:i + 1])
                i += 1
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_a_silent_connection_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        took = _closed_within(sock, 10)
    assert took is not None and took < TIMEOUT + 2, took


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server):
    head = b"GET / HTTP/1.1\r\nHost: test\r\n" + b"X-Pad: " + b"a" * 400 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        took = _closed_within(sock, 10, trickle=head)
    assert took is not None and took < TIMEOUT + 2, took


def test_a_refused_body_still_trickling_is_cut_off(server):
    """The app answered without reading the body; the client keeps sending it."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 100000\r\n\r\n")
        took = _closed_within(sock, 10, trickle=b"x" * 1000)
    assert took is not None and took < TIMEOUT + 2, took


def test_a_long_stream_and_the_next_kept_alive_request_go_through(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for path in ("/slow", "/"):  # the stream lasts 1.2 s, more than the deadline
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            got = b""
            while not got.endswith(b"ok\r\n0\r\n\r\n"):
                chunk = sock.recv(65536)
                assert chunk, f"closed during {path}: {got!r}"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 "), got
            if path == "/slow":
                assert all(b"%d" % i in got for i in range(4))


def test_an_http10_stream_is_close_delimited(server):
    """HTTP/1.0 has no chunked framing: a response without Content-Length is sent as it
    comes and ended by the close (httptools chunked it; a 1.0 proxy passed the chunk sizes
    on as text). HTTP/1.1 keeps its chunks."""
    for version, chunked in (("1.0", False), ("1.1", True)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(f"GET /slow HTTP/{version}\r\nHost: test\r\nConnection: close"
                         "\r\n\r\n".encode())
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        assert (b"transfer-encoding: chunked" in head.lower()) == chunked, head
        if not chunked:
            assert body == b"0123ok", body
