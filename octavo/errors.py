"""Errors a request can end with, shared by the engine and every entry point.

``InvalidRequestError`` is raised at the boundary (SamplingParams, the processor) before a
request is queued; ``param`` names the offending field so servers can answer OpenAI's
``{"error": {..., "param": ...}}``. ``RequestFailedError`` ends one request whose step work
failed (its logits processor, its detokenization) while the engine goes on serving the rest.
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request refused before it is queued; ``param`` is the field at fault (or None)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class RequestFailedError(RuntimeError):
    """A request ended by a fault traced to it while a step ran; others were unaffected."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id
