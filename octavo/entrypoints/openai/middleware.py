"""ASGI middleware at the server's edge: client address behind trusted proxies, body size
and read-time limits, API key, per-client rate limits.

Each answers with OpenAI's error shape. They are plain ASGI (not BaseHTTPMiddleware) so a
streaming response still sees the client's disconnect.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence

from octavo.entrypoints.openai.errors import error_body

# Paths that stay open without a key and are never rate limited (probes and scrapes).
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})
# Seconds a request body may take to arrive (--request-body-timeout): the default
# --max-body-bytes (8 MiB) at about 280 KB/s.
DEFAULT_REQUEST_BODY_TIMEOUT_S = 30.0


async def send_error(send, status: int, message: str, headers: dict[str, str] | None = None,
                     param: str | None = None) -> None:
    body = json.dumps(error_body(status, message, param)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


class BodyLimitMiddleware:
    """413 for request bodies over ``max_bytes`` (by Content-Length, or counted when chunked);
    408 for a body that has not all arrived ``timeout`` seconds after the request's headers,
    so that a client trickling its body a byte at a time (slowloris) cannot hold a connection
    and a task for ever. The 408 closes the connection: the rest of the body is never read.
    The body is read here once and replayed; later receive() calls reach the client, so
    disconnects are still seen."""

    def __init__(self, app, max_bytes: int,
                 timeout: float = DEFAULT_REQUEST_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = (f"request body is larger than the server's limit of {self.max_bytes} "
                   "bytes (--max-body-bytes)")
        length = _header(scope, b"content-length")
        # Answered before the body is read: the connection closes after the answer, or a
        # client could go on sending (trickling) the body it was refused.
        close = {"Connection": "close"}
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, too_big, headers=close)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks, size, more = [], 0, True
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:  # (TimeoutError itself only from Python 3.11)
                return await send_error(
                    send, 408, f"the request body did not arrive within {self.timeout:g} s "
                    f"(--request-body-timeout): {size} bytes came in that time",
                    headers=close)
            if msg["type"] == "http.disconnect":
                return None
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await send_error(send, 413, too_big, headers=close)
            chunks.append(body)
            more = msg.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class TrustedHosts:
    """The peer addresses whose ``X-Forwarded-For`` is believed: uvicorn's
    ``--forwarded-allow-ips`` meaning (comma-separated IPs or networks, ``*`` for any)."""

    def __init__(self, spec: str | Sequence[str] | None) -> None:
        entries = spec.split(",") if isinstance(spec, str) else list(spec or [])
        entries = [e.strip() for e in entries if e.strip()]
        self.any = "*" in entries
        self.networks = [ipaddress.ip_network(e, strict=False) for e in entries if e != "*"]

    def __bool__(self) -> bool:
        return self.any or bool(self.networks)

    def __contains__(self, host: str) -> bool:
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    @staticmethod
    def problem(spec: str) -> str | None:
        """Why ``spec`` is not a valid list, or None (for the command line's error)."""
        try:
            TrustedHosts(spec)
        except ValueError as e:
            return str(e)
        return None


def _client_id(host: str) -> str:
    # A forwarded entry is client-controlled text: keep bucket keys short and canonical.
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return host[:64]


class ForwardedForMiddleware:
    """Sets ``scope["client"]`` from ``X-Forwarded-For``, only when the connection comes from a
    trusted proxy: the client is the right-most address in the header that is not itself a
    trusted proxy (entries to its left were written by the client and can be anything); if
    every entry is trusted, the left-most (so with ``*``, which trusts every hop, the client's
    own claim: only for a proxy that overwrites the header). Any other peer's header is
    ignored, so a client cannot pick the address its rate limit is counted under. With nothing
    trusted this is a no-op, the default."""

    def __init__(self, app, forwarded_allow_ips: str | Sequence[str] | None) -> None:
        self.app = app
        self.trusted = TrustedHosts(forwarded_allow_ips)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and self.trusted:
            client = scope.get("client")
            if client and client[0] in self.trusted:
                hosts = [h.strip() for k, v in scope.get("headers", [])
                         if k.lower() == b"x-forwarded-for"
                         for h in v.decode("latin-1").split(",") if h.strip()]
                if hosts:
                    host = next((h for h in reversed(hosts) if h not in self.trusted), hosts[0])
                    scope = dict(scope, client=(_client_id(host), 0))
        return await self.app(scope, receive, send)


class SlidingWindows:
    """Per-key hit times over the last ``window`` seconds, with a bounded table.

    Keys are kept in least-recently-hit order, so buckets whose newest hit has left the window
    sit at the front and are dropped as hits arrive (amortized O(1)); past ``max_keys`` live
    keys the least recently hit is forgotten. A flood of distinct addresses therefore costs at
    most ``max_keys`` buckets; the price is that an evicted address starts afresh, which only
    someone who controls that many addresses can exploit.
    """

    def __init__(self, window: float = 60.0, max_keys: int = 10_000) -> None:
        self.window = window
        self.max_keys = max_keys
        self._hits: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._hits)

    def _prune(self, now: float) -> None:
        hits = self._hits
        while hits:
            key, times = next(iter(hits.items()))
            if times and times[-1] > now - self.window and len(hits) <= self.max_keys:
                return
            del hits[key]

    def _live(self, key: str, now: float) -> deque[float] | None:
        times = self._hits.get(key)
        if times is not None:
            while times and times[0] <= now - self.window:
                times.popleft()
        return times

    def retry_after(self, key: str, limit: int) -> int | None:
        """None if ``key`` has fewer than ``limit`` hits in the window, else whole seconds
        until one leaves it. Records nothing."""
        now = time.monotonic()
        with self._lock:
            times = self._live(key, now)
            if times is None or len(times) < limit:
                return None
            return max(1, math.ceil(times[-limit] + self.window - now))

    def hit(self, key: str, limit: int | None = None) -> int | None:
        """Record a hit unless ``limit`` hits are in the window already; returns what
        ``retry_after`` would have (None: recorded)."""
        now = time.monotonic()
        with self._lock:
            times = self._live(key, now)
            if times is None:
                times = self._hits[key] = deque()
            elif limit is not None and len(times) >= limit:
                return max(1, math.ceil(times[-limit] + self.window - now))
            times.append(now)
            self._hits.move_to_end(key)
            self._prune(now)
            return None


class AuthRateLimitMiddleware:
    """API key check, failed-authentication limit and per-client request limit.

    Policy, per client address (``scope["client"]``, which ``ForwardedForMiddleware`` sets from
    ``X-Forwarded-For`` for listed proxies only):

    - With ``api_key``: 401 unless ``Authorization: Bearer <api_key>``, compared in constant
      time. After ``max_auth_failures`` failures within a minute an address gets 429 with
      Retry-After on every request, the right key included, until the oldest failure is a
      minute old: guessing the key costs a minute per ``max_auth_failures`` guesses.
    - With ``rate_limit``: 429 with Retry-After past ``rate_limit`` requests a minute. The
      bucket is the client address, with or without a key: a bearer token is the client's own
      choice when no key is set (a fresh token would mean a fresh bucket), and with a key every
      client shares it (one client's burst would block all). Behind a proxy, list it in
      ``--forwarded-allow-ips`` or every client shares the proxy's bucket.

    Probe and scrape paths (``OPEN_PATHS``) need no key and are never limited.
    """

    WINDOW = 60.0

    def __init__(self, app, api_key: str | None = None, rate_limit: int | None = None,
                 max_auth_failures: int = 10, max_clients: int = 10_000) -> None:
        self.app = app
        self.api_key = api_key
        self._key = None if api_key is None else api_key.encode()
        self.rate_limit = rate_limit
        self.max_auth_failures = max_auth_failures
        self.requests = SlidingWindows(self.WINDOW, max_clients)
        self.failures = SlidingWindows(self.WINDOW, max_clients)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        client = scope.get("client")
        addr = client[0] if client else "unknown"
        if self._key is not None:
            retry = self.failures.retry_after(addr, self.max_auth_failures)
            if retry is not None:
                return await send_error(
                    send, 429, f"too many failed authentications from this address; retry "
                    f"after {retry} s", headers={"Retry-After": str(retry)})
            if not hmac.compare_digest(_bearer(scope), self._key):
                self.failures.hit(addr)
                return await send_error(send, 401, "missing or invalid API key "
                                        "(send 'Authorization: Bearer <key>')")
        if self.rate_limit is not None:
            retry = self.requests.hit(addr, self.rate_limit)
            if retry is not None:
                return await send_error(
                    send, 429, f"rate limit of {self.rate_limit} requests per minute exceeded; "
                    f"retry after {retry} s", headers={"Retry-After": str(retry)})
        return await self.app(scope, receive, send)


class RateLimitMiddleware(AuthRateLimitMiddleware):
    """Only the per-client request limit: ``app.add_middleware(RateLimitMiddleware,
    requests_per_minute=100)``."""

    def __init__(self, app, requests_per_minute: int, max_clients: int = 10_000) -> None:
        if requests_per_minute < 1:
            raise ValueError(f"requests_per_minute must be >= 1, got {requests_per_minute}")
        super().__init__(app, api_key=None, rate_limit=requests_per_minute,
                         max_clients=max_clients)


def _bearer(scope) -> bytes:
    """The raw token of ``Authorization: Bearer <token>``; b"" when absent or another scheme."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"authorization":
            scheme, _, token = v.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""
