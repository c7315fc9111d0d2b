"""The exception handlers both servers install (the OpenAI one and the simple /generate one):
every error leaves as OpenAI's JSON error body, with the status its cause deserves."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from octavo.engine.async_llm import EngineDeadError
from octavo.entrypoints.openai.errors import (
    APIError,
    error_body,
    error_param,
    failed_error,
    validation_error,
)
from octavo.errors import RequestFailedError


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def api_error_response(exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.headers)


def body_error(cause: BaseException) -> str:
    """Why a request body could not be read as JSON (bytes that are not UTF-8, an integer
    of thousands of digits, nesting deeper than the parser's recursion limit)."""
    if isinstance(cause, RecursionError):
        return "the request body is not valid JSON: it is nested too deeply"
    return f"the request body is not valid JSON: {type(cause).__name__}: {cause}"


def invalid_request(errors: list[dict[str, Any]]) -> APIError:
    """The 400 for a request body that is not the route's model (the errors of FastAPI's
    ``RequestValidationError``, locations under "body")."""
    return APIError(400, *validation_error(errors))


def unreadable_body(cause: BaseException) -> APIError:
    """The 400 for a request body that the JSON parser gave up on with ``cause``, where
    FastAPI raises its "There was an error parsing the body" ``HTTPException``."""
    return APIError(400, body_error(cause))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return api_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # OpenAI answers 400 (FastAPI would say 422), naming the top-level field.
        return api_error_response(invalid_request(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI's "There was an error parsing the body" hides why: say it.
            return api_error_response(unreadable_body(exc.__cause__))
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError):
        return error_response(503, str(exc))

    @app.exception_handler(ValueError)
    async def _value(request: Request, exc: ValueError):
        return error_response(400, str(exc), error_param(exc))

    @app.exception_handler(RequestFailedError)
    async def _failed(request: Request, exc: RequestFailedError):
        return error_response(*failed_error(exc))
