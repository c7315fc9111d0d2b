"""Errors a request can end with, shared by the engine and every entry point.

``InvalidRequestError`` is raised at the boundary (SamplingParams, the processor) before a
request is queued; ``param`` names the offending field so servers can answer OpenAI's
``{"error": {..., "param": ...}}``. ``RequestFailedError`` ends one request whose step work
failed (its logits processor, its detokenization) while the engine goes on serving the rest.
Also the two helpers every validator's messages share (quoting a client's value, refusing
text that is not valid Unicode).
"""

from __future__ import annotations

from typing import Any


class InvalidRequestError(ValueError):
    """A request refused before it is queued; ``param`` is the field at fault (or None)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class RequestFailedError(RuntimeError):
    """A request ended by a fault traced to it while a step ran; others were unaffected.

    ``param`` is set when the request's own fields are at fault, found only once it ran (a
    structured-output grammar that its ``min_tokens`` or ``allowed_token_ids`` leave no
    token): a client error (``status`` 400) naming that field. Without it the fault was the
    engine's or user code's (a logits processor, detokenization): ``status`` 500."""

    def __init__(self, request_id: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.param = param

    @property
    def status(self) -> int:
        return 500 if self.param is None else 400


def short_repr(value: Any, limit: int = 80) -> str:
    """repr() of a client's value, cut short: an error must not echo megabytes back."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(truncated)"


def check_text(name: str, text: str) -> str:
    """Text must be encodable as UTF-8: a lone surrogate ("\\ud800") cannot be tokenized,
    matched or sent back, so it is refused at the boundary."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(name, f"{name} holds text that is not valid Unicode (a lone "
                                  f"surrogate {text[e.start]!r} at index {e.start})") from None
    return text
