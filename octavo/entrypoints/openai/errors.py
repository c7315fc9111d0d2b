"""The OpenAI error shape of the OpenAI-compatible API: ``{"error": {message, type, param,
code}}``, the field an engine error names, and a message for pydantic's validation errors."""

from __future__ import annotations

import re
from typing import Any

from octavo.errors import RequestFailedError
from octavo.sampling_params import SamplingParams

# Longest error message sent back: a message must never echo a megabyte prompt.
MAX_ERROR_CHARS = 2000


class APIError(Exception):
    """An error returned to the client as {"error": {message, type, param, code}}."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             408: "RequestTimeoutError", 413: "RequestEntityTooLarge", 429: "RateLimitError",
             500: "InternalServerError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def printable(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` safe to put in a response: lone surrogates (which UTF-8 cannot encode, so
    they would make the response itself fail) become ``\\udXXX`` escapes, and it is cut to
    ``limit`` characters."""
    if len(text) > limit:
        text = text[:limit] + "...(truncated)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": printable(str(message)),
                      "type": APIError.TYPES.get(status, "APIError"),
                      "param": None if param is None else printable(str(param), 200),
                      "code": status}}


def error_param(e: BaseException) -> str | None:
    """The field an engine error names: ``InvalidRequestError.param`` (any ValueError that
    carries a ``param``), else the leading ``field=...`` / ``field ...`` word of the message
    when it is a SamplingParams field (the engine's older messages)."""
    param = getattr(e, "param", None)
    if isinstance(param, str):
        return param
    first = str(e).split(" ", 1)[0].split("=", 1)[0]
    return first if first in SAMPLING_FIELD_NAMES else None


SAMPLING_FIELD_NAMES = frozenset(SamplingParams.__dataclass_fields__)


def failed_error(e: RequestFailedError) -> tuple[int, str, str | None]:
    """(status, message, param) for a request that failed while it ran: a 400 naming the
    field when its own constraints were at fault, else a 500."""
    if e.param is not None:
        return 400, f"the request cannot be completed: {e}", e.param
    return 500, f"the request failed in the engine: {e}", None


# pydantic's names for the members of a union, in an error's location: not the client's.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none)$|[\[(]")


def validation_error(errors: list[dict[str, Any]], shown: int = 5) -> tuple[str, str | None]:
    """(message, param) for request validation errors: param is the top-level field of the
    first error (what OpenAI's ``param`` names), the message lists the first few in full."""
    parts: list[str] = []
    param: str | None = None
    seen: set[str] = set()
    for e in errors:
        loc = [p for p in e.get("loc", ()) if not (isinstance(p, str) and _UNION_TAG.search(p))]
        if loc and loc[0] == "body":
            loc = loc[1:]
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error") or e.get("msg")
            at = f" (character {loc[0]})" if loc and isinstance(loc[0], int) else ""
            parts.append(f"the request body is not valid JSON: {reason}{at}")
            continue
        if param is None and loc:
            param = str(loc[0])
        where = ".".join(str(p) for p in loc) or "body"
        # A union reports every member that failed; its first member says enough.
        if where in seen:
            continue
        seen.add(where)
        if len(seen) > shown:
            parts.append("and more")
            break
        got = e.get("input")
        shown_input = ""
        if isinstance(got, bool | int | float | str) and str(e.get("type", "")).endswith(
                ("_type", "than", "than_equal", "finite_number", "parsing")):
            text = repr(got)
            shown_input = f", got {text if len(text) <= 40 else text[:40] + '...'}"
        parts.append(f"{where}: {e.get('msg')}{shown_input}")
    return "; ".join(parts) or "invalid request", param
