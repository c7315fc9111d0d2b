"""Reading a large JSON request body off the event loop, for both servers.

FastAPI parses a route's JSON body and validates it against the route's pydantic model on
the event loop, before the route runs. For a body of megabytes that took most of a second
(8 MB of nested lists: ~0.9 s) in which the loop served nobody: every other client's
stream stalled and /health did not answer. Here a body larger than ``LARGE_BODY_BYTES`` is
parsed and validated on the server's offload pool, with the garbage collector paused
(``collector_pause``); smaller bodies keep the event loop, as handing work to a thread
costs ~50-100 us.

- OpenAI routes are built with ``offloaded_body_route(offload)``: FastAPI's handler then
  gets the finished model (pydantic passes an instance of the route's model through
  without validating it again). The OpenAPI schema is FastAPI's, from the route's
  signature, untouched; small bodies and bodies that are not JSON take FastAPI's own path.
- /generate reads its body itself: ``parse_body(offload, parse_generate_request, body)``.

A refused large body gets the answer the small one gets from the app's handlers
(``error_handlers``): the same 400, in OpenAI's shape, naming the same field. It leaves the
worker as a fresh ``APIError``, holding none of the parsed body, so that the body is freed
there, with the collector still paused, rather than on the event loop.

The worker still holds the GIL while it works. Python code (the validators of every text
field, the chat messages' checks) lets the loop in at the interpreter's switch interval;
``json.loads`` and pydantic's own checks are C and Rust calls that do not: the remaining
stall is the parse of the body, ~0.2 s for 8 MB of ``[[0],[0],...]``.
"""

from __future__ import annotations

import email.message
import functools
import inspect
import json
import typing
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from octavo.entrypoints.openai.collector_pause import collector_paused
from octavo.entrypoints.openai.error_handlers import invalid_request, unreadable_body
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.serving_engine import Offload

T = TypeVar("T")

# Bodies larger than this are parsed and validated on the offload pool.
LARGE_BODY_BYTES = 64 * 1024


def _paused(parse: Callable[[bytes], T], body: bytes) -> T:
    with collector_paused():
        try:
            return parse(body)
        except APIError as e:  # its traceback's frames and its context hold the body
            error = APIError(e.status, e.message, e.param, e.headers)
    raise error


async def parse_body(offload: Offload, parse: Callable[[bytes], T], body: bytes) -> T:
    """``parse(body)``: on the event loop for a small body, on ``offload``'s pool with the
    collector paused for a large one. An ``APIError`` it raises for a large body is
    raised afresh, so that the parsed body is freed before the collector resumes."""
    if len(body) <= LARGE_BODY_BYTES:
        return parse(body)
    return await offload.run(_paused, parse, body)


def is_json_content(content_type: str | None) -> bool:
    """Whether FastAPI reads a body with this Content-Type as JSON (application/json or
    application/*+json; a body without a Content-Type it does not parse)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def validated_body(model: type[BaseModel], body: bytes) -> BaseModel:
    """``body`` as ``model``, as FastAPI reads a JSON body (``json.loads``, then pydantic
    with ``from_attributes``); ``APIError`` 400 with the answer the app's handlers give
    FastAPI's exceptions otherwise."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise invalid_request([{"type": "json_invalid", "loc": ("body", e.pos),
                                "msg": "JSON decode error", "input": {},
                                "ctx": {"error": e.msg}}]) from None
    except Exception as e:  # bytes that are not UTF-8, nesting too deep, a 5000-digit int
        raise unreadable_body(e) from None
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as e:
        raise invalid_request([{**err, "loc": ("body", *err["loc"])}
                               for err in e.errors(include_url=False)]) from None


def body_model(endpoint: Callable[..., Any]) -> type[BaseModel] | None:
    """The model FastAPI validates the whole JSON body of ``endpoint`` against, when the
    endpoint takes that and nothing else but the request: one parameter annotated with a
    pydantic model (no default, no ``Annotated`` extras such as ``Body(embed=True)``) and
    any number annotated ``Request``. None for any other endpoint, left to FastAPI."""
    try:
        hints = typing.get_type_hints(endpoint, include_extras=True)
    except (NameError, TypeError):  # an annotation this cannot resolve: FastAPI's business
        return None
    models = []
    for name, param in inspect.signature(endpoint).parameters.items():
        hint = hints.get(name)
        if isinstance(hint, type) and issubclass(hint, Request):
            continue
        if not (isinstance(hint, type) and issubclass(hint, BaseModel)
                and param.default is inspect.Parameter.empty):
            return None
        models.append(hint)
    return models[0] if len(models) == 1 else None


class _ParsedRequest(Request):
    """The request with its body already read, parsed and validated: ``json()`` is the
    model. Later ``receive()`` calls reach the client, so disconnects are still seen."""

    def __init__(self, request: Request, body: bytes, model: BaseModel) -> None:
        replayed = False

        async def receive():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await request.receive()

        super().__init__(request.scope, receive)
        self._model = model

    async def json(self) -> Any:
        return self._model


def offloaded_body_route(offload: Offload) -> type[APIRoute]:
    """A route class whose routes with a pydantic body read a large JSON body on
    ``offload``'s pool (the module's docstring); other routes are FastAPI's own."""

    class OffloadedBodyRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            model = body_model(self.endpoint) if self.body_field is not None else None
            if model is None:
                return handler
            parse = functools.partial(validated_body, model)

            async def handle(request: Request) -> Response:
                if not is_json_content(request.headers.get("content-type")):
                    return await handler(request)
                body = await request.body()
                if len(body) <= LARGE_BODY_BYTES:
                    return await handler(request)
                value = await parse_body(offload, parse, body)
                return await handler(_ParsedRequest(request, body, value))

            return handle

    return OffloadedBodyRoute
