"""OpenAPI documentation of what the servers really send: the OpenAI error shape for every
error status a route can answer, instead of FastAPI's 422 ``HTTPValidationError`` (never sent:
validation errors are 400s in OpenAI's shape).

``document_errors(app, ...)`` post-processes ``app.openapi()`` once; a schema-driven client
(the openai SDK generator, schemathesis in tests/test_fuzz_server.py) can then check each
status code and error body against it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, create_model

from octavo.entrypoints.openai.middleware import OPEN_PATHS


class ErrorInfo(BaseModel):
    message: str = Field(description="what is wrong, naming the offending field and value")
    type: str = Field(description="BadRequestError, AuthenticationError, NotFoundError, ...")
    param: str | None = Field(description="the request field at fault, when there is one")
    code: int = Field(description="the HTTP status code")


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


ERROR_DESCRIPTIONS = {
    400: "Invalid request: a field with a wrong type or an out-of-range value, or a prompt "
         "the model cannot take (the message and param name the field)",
    401: "Missing or wrong API key (the server was started with --api-key)",
    404: "The model named in the request is not served here",
    408: "The request body did not all arrive within --request-body-timeout seconds (the "
         "connection is closed)",
    413: "The request body is larger than --max-body-bytes",
    429: "Too many requests (--rate-limit) or failed authentications from this address; "
         "the Retry-After header says when to retry",
    500: "An internal error",
    503: "The engine is dead, the server is busy, or it is shutting down (draining)",
}

# One server-sent event (OpenAPI 3.1: the event-stream ``schema`` describes each event).
_SSE_EVENT = {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk (a completion "
                            "chunk, or an error body once the stream has begun); [DONE] last"},
                   "event": {"type": "string"}, "id": {"type": "string"}}}}
_NDJSON = {"schema": {"type": "string", "description": 'one JSON object a line: {"text": '
                      '[prompt + completion so far, one per sample]}, or an error body'}}

# Success bodies that are not the application/json FastAPI assumes (with ``stream``: true,
# the completions routes stream server-sent events, /generate JSON lines).
SUCCESS_CONTENT: dict[str, dict[str, Any]] = {
    "/health": {},  # an empty 200
    "/metrics": {"text/plain": {"schema": {"type": "string"}}},
    "/v1/completions": {"application/json": {"schema": {}}, "text/event-stream": _SSE_EVENT},
    "/v1/chat/completions": {"application/json": {"schema": {}},
                             "text/event-stream": _SSE_EVENT},
    "/generate": {"application/json": {"schema": {}}, "application/x-ndjson": _NDJSON},
}

_REF = "#/components/schemas/"


def error_statuses(method: str, path: str, operation: dict[str, Any], schema: dict[str, Any],
                   api_key: bool, rate_limit: bool) -> list[int]:
    """The error statuses one operation can answer with this server's settings."""
    # 500: the error guard's JSON answer to anything unhandled. 503: a dead engine, a busy
    # chat-template pool, or (any route) a server draining after SIGTERM (launcher.py).
    statuses = [500, 503]
    has_body = "requestBody" in operation
    if has_body:
        statuses.append(400)
    if method.upper() in ("POST", "PUT", "PATCH"):
        statuses += [408, 413]  # BodyLimitMiddleware, before anything reads the body
    if path not in OPEN_PATHS:
        if api_key:
            statuses.append(401)
        if rate_limit or api_key:  # api_key: repeated failed authentications are limited
            statuses.append(429)
    if has_body and "model" in _body_properties(operation, schema):
        statuses.append(404)
    return sorted(statuses)


def _body_properties(operation: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    content = operation["requestBody"].get("content", {})
    body = content.get("application/json", {}).get("schema", {})
    ref = body.get("$ref", "")
    if ref.startswith(_REF):
        body = schema.get("components", {}).get("schemas", {}).get(ref[len(_REF):], {})
    return body.get("properties", {})


def rewrite_openapi(schema: dict[str, Any], api_key: bool = False,
                    rate_limit: bool = False) -> dict[str, Any]:
    """Replace FastAPI's 422 by the statuses really sent, each with ``ErrorResponse``."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, sub in _model_schemas(ErrorResponse).items():
        components[name] = sub
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            if path in SUCCESS_CONTENT and "200" in responses:
                ok = responses["200"]
                ok.pop("content", None)
                if SUCCESS_CONTENT[path]:
                    ok["content"] = SUCCESS_CONTENT[path]
            for status in error_statuses(method, path, op, schema, api_key, rate_limit):
                entry: dict[str, Any] = {
                    "description": ERROR_DESCRIPTIONS[status],
                    "content": {"application/json": {"schema": {"$ref": _REF + "ErrorResponse"}}}}
                if status == 429:
                    entry["headers"] = {"Retry-After": {
                        "description": "seconds until a request is accepted again",
                        "schema": {"type": "integer"}}}
                responses[str(status)] = entry
            if api_key and path not in OPEN_PATHS:
                op["security"] = [{"bearerAuth": []}]
    if api_key:
        schema["components"].setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http", "scheme": "bearer"}
    return schema


def _model_schemas(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema and its nested models, with OpenAPI component references."""
    top = model.model_json_schema(ref_template=_REF + "{model}")
    defs = top.pop("$defs", {})
    return {**defs, model.__name__: top}


def document_errors(app: FastAPI, api_key: bool = False, rate_limit: bool = False) -> None:
    """Make ``app.openapi()`` document the error responses the server sends (once, cached)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = rewrite_openapi(generate(), api_key, rate_limit)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def dataclass_body_schema(cls: type, fields: Iterable[str],
                          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON request-body schema whose properties are ``fields`` of dataclass ``cls`` (with
    their annotated types) plus ``extra`` {name: (type, default)}; unknown fields refused."""
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    spec: dict[str, Any] = {name: (hints[name], defaults.get(name, None))
                            for name in sorted(fields)}
    spec.update(extra or {})
    model = create_model(f"{cls.__name__}Body", __config__=ConfigDict(extra="forbid"), **spec)
    return _inline_defs(model.model_json_schema())


def _inline_defs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its ``$defs`` references replaced by the definitions: inside an
    operation's requestBody, "#/$defs/..." would point at the OpenAPI document's root, where
    no such definitions are (schemathesis then generated a single case for /generate)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def json_request_body(body_schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its JSON body itself (no pydantic parameter)."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": body_schema}}}}
