"""The serving loop of both API servers: uvicorn with a bounded, graceful shutdown.

On SIGTERM or SIGINT the server stops listening (new connections are refused), answers 503 to
any request that still arrives on an open connection, and lets in-flight requests finish for
at most ``shutdown_timeout`` seconds. Then it shuts the engine down, which aborts what is left
and fails each request's stream with EngineDeadError: the servers' streaming generators turn
that into an in-band error (an OpenAI error event and ``data: [DONE]``, or an NDJSON error
line), so every client sees its stream end cleanly. The process exits 0. A second signal
skips the rest of the drain and ends the remaining streams the same way at once.

If the engine dies of a fault it cannot recover from (see AsyncLLM's restarts), the server
shuts down the same way and the process exits 1, so a supervisor restarts it: never a live
process in front of a dead engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time

import uvicorn

from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.header_deadline import (
    DEFAULT_REQUEST_HEADER_TIMEOUT_S,
    head_deadline_protocol,
)
from octavo.entrypoints.openai.errors import error_body
from octavo.entrypoints.openai.middleware import ForwardedForMiddleware

logger = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# After the engine is shut down the streams need only to send their last event; past this the
# leftover request tasks are cancelled (only a stuck client or engine thread gets there).
_FINISH_TIMEOUT = 5.0
_POLL = 0.05


class DrainGate:
    """503 (and ``Connection: close``) for every HTTP request once ``draining`` is set; the
    listening socket is closed by then, so only a kept-alive connection can still bring one."""

    def __init__(self, app) -> None:
        self.app = app
        self.draining = False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.draining:
            body = json.dumps(error_body(503, "the server is shutting down")).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return None
        return await self.app(scope, receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains in-flight requests (bounded) and then ends them
    through the engine, instead of cancelling their tasks mid-stream."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, gate: DrainGate,
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.gate = gate
        self.shutdown_timeout = shutdown_timeout
        self.forced = False
        self.fatal: BaseException | None = None
        engine.fatal_callbacks.append(self.on_engine_fatal)

    def on_engine_fatal(self, error: BaseException) -> None:
        """The engine died (called on its thread): stop serving, at once, with exit code 1."""
        logger.critical("the engine died (%s); shutting the server down", error)
        self.fatal = error
        self.forced = True  # nothing in flight can finish on a dead engine
        self.should_exit = True
        self.gate.draining = True

    def handle_exit(self, sig, frame) -> None:
        # Runs as a signal handler: set flags only; main_loop and the drain poll them. Unlike
        # uvicorn's, the signal is not re-raised after shutdown, so the process exits 0.
        if self.should_exit:
            self.forced = True
        self.should_exit = True
        self.gate.draining = True

    async def shutdown(self, sockets=None) -> None:
        self.gate.draining = True
        for server in getattr(self, "servers", []):
            server.close()  # stop listening: new connections are refused from here on
        for conn in list(self.server_state.connections):
            conn.shutdown()  # idle keep-alive connections close; busy ones after the response
        tasks = self.server_state.tasks
        if tasks and not self.forced:
            logger.info("draining %d request(s) for up to %.0f s (signal again to stop now)",
                        len(tasks), self.shutdown_timeout)
        deadline = time.monotonic() + self.shutdown_timeout
        while tasks and not self.forced and time.monotonic() < deadline:
            await asyncio.sleep(_POLL)
        if tasks:
            logger.warning("ending %d unfinished request(s)", len(tasks))
        # Also when nothing is in flight: later lifespan shutdown then finds the engine stopped.
        await asyncio.get_running_loop().run_in_executor(None, self.engine.shutdown)
        deadline = time.monotonic() + _FINISH_TIMEOUT
        while tasks and time.monotonic() < deadline:
            await asyncio.sleep(_POLL)
        for task in list(tasks):
            task.cancel()
        await super().shutdown(sockets)


# Everything Octavo starts listens on loopback unless the user asks for another host
# (--host 0.0.0.0 for all interfaces, e.g. inside a container).
DEFAULT_HOST = "127.0.0.1"


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine loads (minutes for a large model): a port
    in use, a port out of range or a host that does not resolve is said at once, and nothing
    takes the port meanwhile. Bound, not listening, so a client that connects before the
    server is ready is refused rather than left waiting. OSError says why."""
    if not 0 <= port <= 65535:
        raise OSError(f"port must be 0-65535, got {port}")
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


def bind_and_start(args, start_engine) -> tuple[socket.socket, AsyncLLM] | None:
    """A server's socket (bound first: ``listen_socket``) and then its engine, from its
    parsed flags; None, the reason printed, when either cannot be had (the servers then
    exit 2)."""
    host = args.host or DEFAULT_HOST
    try:
        sock = listen_socket(host, args.port)
    except OSError as e:
        print(f"octavo: error: cannot listen on {host}:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return None
    engine = start_engine(args)
    if engine is None:
        sock.close()
        return None
    return sock, engine


def serve_flags(app, engine: AsyncLLM, args, sock: socket.socket) -> int:
    """``serve`` with a server's parsed flags, on the socket ``bind_and_start`` bound."""
    try:
        return serve(app, engine, host=args.host or DEFAULT_HOST, port=args.port,
                     log_level=args.uvicorn_log_level, shutdown_timeout=args.shutdown_timeout,
                     forwarded_allow_ips=args.forwarded_allow_ips, sock=sock,
                     header_timeout=args.request_header_timeout)
    finally:
        sock.close()  # (uvicorn closed it already when it served)


def serve(app, engine: AsyncLLM, *, host: str, port: int, log_level: str = "info",
          shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
          forwarded_allow_ips: str | None = None, sock: socket.socket | None = None,
          header_timeout: float = DEFAULT_REQUEST_HEADER_TIMEOUT_S) -> int:
    """Serve ``app`` (whose requests run on ``engine``) until a signal (returns 0 after a
    clean shutdown) or the engine's death (returns 1). ``sock``: ``listen_socket``'s, bound
    before the engine started (else uvicorn binds ``host:port`` itself). ``header_timeout``:
    seconds a connection may wait for a request's head (``header_deadline``)."""
    gate = DrainGate(ForwardedForMiddleware(app, forwarded_allow_ips))
    # proxy_headers off: X-Forwarded-For is honoured only from --forwarded-allow-ips, by
    # ForwardedForMiddleware (uvicorn's own default would trust 127.0.0.1).
    config = uvicorn.Config(gate, host=host, port=port, log_level=log_level,
                            proxy_headers=False, timeout_graceful_shutdown=_FINISH_TIMEOUT,
                            http=head_deadline_protocol(header_timeout))
    server = GracefulServer(config, engine, gate, shutdown_timeout)
    server.run(sockets=None if sock is None else [sock])
    return 1 if server.fatal is not None else 0
