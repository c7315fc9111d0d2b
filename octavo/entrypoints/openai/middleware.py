"""ASGI middleware at the server's edge: body size limit, API key, per-client rate limit.

Each answers with OpenAI's error shape. They are plain ASGI (not BaseHTTPMiddleware) so a
streaming response still sees the client's disconnect.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque

from octavo.entrypoints.openai.protocol import error_body

# Paths that stay open without a key and are never rate limited (probes and scrapes).
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})


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
    """413 for request bodies over ``max_bytes`` (by Content-Length, or counted when chunked).
    The body is read here once and replayed; later receive() calls reach the client, so
    disconnects are still seen."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = (f"request body is larger than the server's limit of {self.max_bytes} "
                   "bytes (--max-body-bytes)")
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, too_big)
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await send_error(send, 413, too_big)
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


class AuthRateLimitMiddleware:
    """401 unless ``Authorization: Bearer <api_key>`` matches (when a key is set); 429 with
    Retry-After past ``rate_limit`` requests per minute per API key or client address."""

    WINDOW = 60.0

    def __init__(self, app, api_key: str | None, rate_limit: int | None) -> None:
        self.app = app
        self.api_key = api_key
        self.rate_limit = rate_limit
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        auth = _header(scope, b"authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if self.api_key is not None and token != self.api_key:
            return await send_error(send, 401, "missing or invalid API key "
                                    "(send 'Authorization: Bearer <key>')")
        if self.rate_limit is not None:
            client = scope.get("client") or ("unknown", 0)
            key = f"key:{token}" if token else f"addr:{client[0]}"
            retry = self._retry_after(key)
            if retry is not None:
                return await send_error(
                    send, 429, f"rate limit of {self.rate_limit} requests per minute exceeded; "
                    f"retry after {retry} s", headers={"Retry-After": str(retry)})
        return await self.app(scope, receive, send)

    def _retry_after(self, key: str) -> int | None:
        """Record a hit; None if it is allowed, else whole seconds until a slot frees."""
        now = time.monotonic()
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] <= now - self.WINDOW:
                hits.popleft()
            if len(hits) >= self.rate_limit:
                return max(1, math.ceil(hits[0] + self.WINDOW - now))
            hits.append(now)
            return None
