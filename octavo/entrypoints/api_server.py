"""The simple demo server, in vLLM's legacy format:
``python -m octavo.entrypoints.api_server --model ... --port ...``.

POST /generate with JSON ``{"prompt": str, "stream": bool, ...SamplingParams fields}`` answers
``{"text": [prompt + completion, one per sample]}``; with ``"stream": true`` it sends one such
JSON object per line (newline-delimited), each with the cumulative text so far.
GET /health answers 200 while the engine lives (with ``--num-replicas N``: while a replica
is ready, listing every replica). For anything beyond a demo use the
OpenAI-compatible server (``octavo.entrypoints.openai.api_server``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

import octavo
from octavo.engine.beam_runner import validation_params
from octavo.entrypoints.engine_client import EngineClient, health_response
from octavo.entrypoints.openai.api_server import (
    DEFAULT_MAX_BODY_BYTES,
    make_arg_parser,
    start_engine,
)
from octavo.entrypoints.openai.error_handlers import install_error_handlers
from octavo.entrypoints.openai.error_schema import (
    dataclass_body_schema,
    document_errors,
    json_request_body,
)
from octavo.entrypoints.openai.errors import APIError, error_param
from octavo.entrypoints.openai.middleware import (
    DEFAULT_REQUEST_BODY_TIMEOUT_S,
    AuthRateLimitMiddleware,
    BodyLimitMiddleware,
)
from octavo.entrypoints.openai.request_body import parse_body
from octavo.entrypoints.openai.serving_engine import (
    CLIENT_GONE_STATUS,
    ErrorGuardMiddleware,
    OpenAIServing,
    random_id,
    stream_error,
)
from octavo.entrypoints.request_limits import (
    LIST_LIMITS,
    constraint_too_big,
    stop_too_long,
    too_many,
)
from octavo.outputs import RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

# SamplingParams fields a client may set: output_kind is the server's business, and
# logits_processors are Python callables (offline LLM only).
_SERVER_ONLY = frozenset({"output_kind", "logits_processors"})
SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams)
                            if f.init and f.name not in _SERVER_ONLY)


def parse_generate_request(body: bytes) -> tuple[str, bool, SamplingParams]:
    """The prompt, the stream flag and the sampling parameters of a /generate body;
    APIError 400 naming the problem otherwise."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:  # ValueError: also an int of 5000 digits
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got "
                       f"{type(data).__name__}")
    data = dict(data)
    if "prompt" not in data:
        raise APIError(400, "prompt is required", param="prompt")
    prompt = data.pop("prompt")
    if not isinstance(prompt, str):
        raise APIError(400, f"prompt must be a string, got {type(prompt).__name__}",
                       param="prompt")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"prompt holds text that is not valid Unicode (a lone surrogate "
                       f"at index {e.start})", param="prompt") from None
    stream = data.pop("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {str(stream)[:40]!r}",
                       param="stream")
    unknown = sorted(set(data) - SAMPLING_FIELDS)
    if unknown:
        raise APIError(400, f"unknown field(s) {[u[:40] for u in unknown[:5]]}; accepted: "
                       f"prompt, stream, and the SamplingParams fields "
                       f"{sorted(SAMPLING_FIELDS)}", param=unknown[0][:40])
    for field, limit in LIST_LIMITS.items():  # before SamplingParams checks every item
        reason = too_many(data.get(field), limit)
        if reason is not None:
            raise APIError(400, f"{field}: {reason}", param=field)
    reason = stop_too_long(data.get("stop"))
    if reason is not None:
        raise APIError(400, f"stop: {reason}", param="stop")
    try:
        params = SamplingParams(**data, output_kind=RequestOutputKind.CUMULATIVE)
    except (ValueError, TypeError, OverflowError) as e:
        param = error_param(e)
        raise APIError(400, str(e), param=param if param in SAMPLING_FIELDS else None
                       ) from None
    reason = constraint_too_big(params.structured_outputs)
    if reason is not None:
        raise APIError(400, f"structured_outputs: {reason}", param="structured_outputs")
    return prompt, stream, params


def _texts(prompt: str, out: RequestOutput) -> list[str]:
    return [prompt + c.text for c in sorted(out.outputs, key=lambda c: c.index)]


def build_app(engine: EngineClient, served_model_names: Sequence[str] | None = None,
              api_key: str | None = None, rate_limit: int | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              shutdown_engine: bool = True,
              request_body_timeout: float = DEFAULT_REQUEST_BODY_TIMEOUT_S) -> FastAPI:
    names = list(served_model_names or [engine.model_config.served_model_name])
    serving = OpenAIServing(engine, names)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if shutdown_engine:
            engine.shutdown()

    app = FastAPI(title="Octavo simple API server", version=octavo.__version__,
                  lifespan=lifespan)
    app.state.engine = engine
    document_errors(app, api_key=api_key is not None, rate_limit=rate_limit is not None)

    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return health_response(engine)

    @app.post("/generate", openapi_extra=json_request_body(dataclass_body_schema(
        SamplingParams, SAMPLING_FIELDS, {"prompt": (str, ...), "stream": (bool, False)})))
    async def generate(raw_request: Request):
        # Off the event loop: a large body's parameters, then tokenization and the engine's
        # checks (the engine then receives token ids and never tokenizes).
        body = await raw_request.body()
        prompt, stream, params = await parse_body(serving.offload, parse_generate_request,
                                                  body)
        if not stream:  # one answer at the end: a request lost with a replica can be retried
            params.output_kind = RequestOutputKind.FINAL_ONLY
        serving.check_alive()
        # Beam search runs above the engine: the processor checks the rest of it.
        ready = await serving.prepare([prompt], validation_params(serving.engine.engine, params))
        results = serving.generate_all(ready, params, random_id("generate"))
        if stream:
            return StreamingResponse(_stream(prompt, results),
                                     media_type="application/x-ndjson")
        finals = await serving.collect(results, raw_request)
        if finals is None:
            return Response(status_code=CLIENT_GONE_STATUS)
        return await serving.json_response(lambda: {"text": _texts(prompt, finals[0])})

    app.add_middleware(AuthRateLimitMiddleware, api_key=api_key, rate_limit=rate_limit)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes,
                       timeout=request_body_timeout)
    # Outside everything: whatever escapes is a JSON 500, logged.
    app.add_middleware(ErrorGuardMiddleware)
    return app


async def _stream(prompt: str,
                  results: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[bytes]:
    try:
        async for _, out in results:
            yield (json.dumps({"text": _texts(prompt, out)}) + "\n").encode()
    except Exception as e:  # noqa: BLE001 - the status is sent already: report in-band
        yield (json.dumps(stream_error(e)) + "\n").encode()
    finally:
        await results.aclose()  # type: ignore[attr-defined]


def make_parser() -> argparse.ArgumentParser:
    return make_arg_parser(argparse.ArgumentParser(
        prog="python -m octavo.entrypoints.api_server",
        description="Octavo simple API server (vLLM's legacy /generate)"))


def run_server(args: argparse.Namespace) -> int:
    from octavo.entrypoints.launcher import bind_and_start, serve_flags

    started = bind_and_start(args, start_engine)
    if started is None:
        return 2
    sock, engine = started
    app = build_app(engine, args.served_model_name, api_key=args.api_key,
                    rate_limit=args.rate_limit, max_body_bytes=args.max_body_bytes,
                    request_body_timeout=args.request_body_timeout)
    return serve_flags(app, engine, args, sock)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO)
    return run_server(make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
