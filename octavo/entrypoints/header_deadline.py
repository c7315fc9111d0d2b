"""uvicorn's HTTP/1.1 protocols with a deadline on each request's head.

uvicorn arms no timer on a new connection, and its keep-alive timer stops at the first byte
of the next request: a client that connects and sends nothing, or sends its request line and
headers a byte at a time (slowloris), holds a connection and its buffers for as long as it
likes. A few thousand such clients use up the server's file descriptors, and real clients
are then refused. Here a connection waiting for a request's head (new, between requests, or
still sending a body the server already answered without reading) is closed
``--request-header-timeout`` seconds after it started waiting. A request whose head has
arrived is not timed here: its body has ``--request-body-timeout`` (``BodyLimitMiddleware``)
and its response, streamed for as long as generation runs, is the engine's to end.

The protocol is uvicorn's own choice ("auto"): httptools where it is installed, else h11.
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)

# Seconds a connection may wait for a request's complete head (--request-header-timeout).
DEFAULT_REQUEST_HEADER_TIMEOUT_S = 20.0


class _HeadDeadline:
    """Mixed into a uvicorn HTTP protocol class (``head_deadline_protocol``)."""

    header_timeout = DEFAULT_REQUEST_HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        self._head_timer = None
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_head():
            self._arm()

    def _waiting_for_head(self) -> bool:
        """No request of this connection is with the application."""
        return self.cycle is None or self.cycle.response_complete

    def _head_arrived(self) -> None:
        if not self._waiting_for_head():
            self._disarm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expired(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            logger.info("closing the connection of %s: no complete request head within "
                        "%g s (--request-header-timeout)", client, self.header_timeout)
            self.transport.close()


def _close_delimited(cycle) -> None:
    """An HTTP/1.0 request's response without a Content-Length is sent as it comes and ended
    by closing the connection, as HTTP/1.0 defines: uvicorn's httptools protocol sent it with
    ``Transfer-Encoding: chunked`` (an HTTP/1.1 framing a 1.0 client does not undo: a proxy
    speaking HTTP/1.0 to its upstream, nginx's default, passed the chunk sizes on as text).
    h11 already does this. The cycle's own send is given the byte counts it checks."""
    send = cycle.send
    state = {"open": False}

    async def send_close_delimited(message) -> None:
        if message["type"] == "http.response.start" and not cycle.response_started:
            framed = any(k.lower() in (b"content-length", b"transfer-encoding")
                         for k, _ in message.get("headers", []))
            if not framed and cycle.scope["method"] != "HEAD" and \
                    message["status"] not in (204, 304):
                cycle.chunked_encoding = False  # no chunks: the body runs to the close
                cycle.expected_content_length = 1 << 62
                state["open"] = True
        elif message["type"] == "http.response.body" and state["open"] and \
                not message.get("more_body", False):
            cycle.expected_content_length = len(message.get("body", b""))
        await send(message)

    cycle.send = send_close_delimited


def head_deadline_protocol(timeout: float = DEFAULT_REQUEST_HEADER_TIMEOUT_S,
                           http: str = "auto") -> type:
    """A uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) closing connections that
    wait more than ``timeout`` seconds for a request's head. ``http``: "h11", "httptools" or
    "auto" (httptools where installed, as uvicorn chooses)."""
    if http == "auto":
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base

        class Protocol(_HeadDeadline, base):
            def on_headers_complete(self) -> None:
                super().on_headers_complete()
                self._head_arrived()
                if self.cycle is not None and self.scope.get("http_version") == "1.0":
                    _close_delimited(self.cycle)
    elif http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

        class Protocol(_HeadDeadline, base):
            def handle_events(self) -> None:
                super().handle_events()
                self._head_arrived()
    else:
        raise ValueError(f"http must be auto, h11 or httptools, got {http!r}")
    Protocol.header_timeout = timeout
    Protocol.__name__ = Protocol.__qualname__ = f"HeadDeadline{base.__name__}"
    return Protocol
