"""What the completions and chat handlers share: model-name checks, validation through the
engine's processor, running several requests at once, SSE framing, error mapping, and the
thread pools that keep CPU-heavy request work (tokenization, chat templates, large
responses) off the event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi.responses import Response

from octavo import envs
from octavo.engine.async_llm import AsyncLLM, EngineDeadError
from octavo.engine.processor import PromptType, check_context_length
from octavo.entrypoints.openai.errors import APIError, error_body, error_param, failed_error
from octavo.errors import InvalidRequestError, RequestFailedError
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Worker threads for tokenization, validation and response building. The tokenizer releases
# the GIL while it works, so the event loop keeps answering (/health) meanwhile.
CPU_WORKERS = 4
# Token-id prompts of at most this many ids in all are checked on the event loop (no
# tokenizer runs; ~0.15 ms for 1,024 ids): the round trip through the pool would make the
# handler wait for the requests a burst queued meanwhile before its request reaches the
# engine. Text, and more ids, go to the pool.
INLINE_MAX_IDS = 4096
# Chat templates rendering at once, process-wide. A render past its time bound cannot be
# killed (it is a thread); it keeps its slot until it ends, so stuck renders cannot pile up.
MAX_RENDERS = 4
DEFAULT_RENDER_TIMEOUT_S = 10.0


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


json_str = json.encoder.encode_basestring_ascii  # what json.dumps does to a str, in C


class ChunkFramer:
    """SSE events of one streamed response whose chunks differ only in their choice: the
    constant head (id, object, created, model) is encoded once, not per token."""

    def __init__(self, request_id: str, obj: str, created: int, model: str) -> None:
        head = json.dumps({"id": request_id, "object": obj, "created": created,
                           "model": model}, separators=(",", ":"))
        self._head = f"data: {head[:-1]},\"choices\":["

    def event(self, choice_json: str) -> str:
        return f"{self._head}{choice_json}]}}\n\n"


def json_value(value: str | int | None) -> str:
    """A finish or stop reason (None, a string or a token id) as JSON."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return json_str(value)
    return json.dumps(value)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def json_bytes(obj: Any) -> bytes:
    """Compact JSON as UTF-8. Text that UTF-8 cannot encode (a lone surrogate) is sent as
    a JSON escape instead of failing the response."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("ascii")


def finite_logprob(value: float) -> float:
    """JSON has no -inf or NaN: a token the model rules out gets vLLM's -9999.0."""
    return value if value == value and value > -9999.0 else -9999.0


class RendersBusy(Exception):
    """Every chat-template slot stayed busy for the whole time bound."""


class Offload:
    """Runs request work off the event loop: ``run`` on a small thread pool, ``run_bounded``
    (chat templates, which a client may write) on its own daemon thread with a time bound and
    a cap on how many run at once."""

    def __init__(self, workers: int = CPU_WORKERS, max_bounded: int = MAX_RENDERS) -> None:
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="octavo-server-cpu")
        self.max_bounded = max_bounded
        self._slots = threading.BoundedSemaphore(max_bounded)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    @property
    def bounded_running(self) -> int:
        """Bounded calls still running, abandoned ones included."""
        return self.max_bounded - self._slots._value  # type: ignore[attr-defined]

    async def run_bounded(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()`` on a daemon thread; TimeoutError when it runs past ``timeout`` seconds,
        RendersBusy when no slot frees up within ``timeout``. A daemon thread, not a pool: a
        render that never ends must not hold up the process at exit."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._slots.acquire(blocking=False):
            if loop.time() >= deadline:
                raise RendersBusy()
            await asyncio.sleep(0.02)
        fut: asyncio.Future = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.done():  # timed out (cancelled) meanwhile: nobody waits
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def target() -> None:
            result, error = None, None
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting request
                error = e
            finally:
                self._slots.release()
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass

        threading.Thread(target=target, name="octavo-chat-template", daemon=True).start()
        return await asyncio.wait_for(fut, timeout)


_default_offload: Offload | None = None
_default_lock = threading.Lock()


def default_offload() -> Offload:
    """One Offload for the process: every app and handler shares its threads and its cap on
    chat templates rendering at once."""
    global _default_offload
    with _default_lock:
        if _default_offload is None:
            _default_offload = Offload()
        return _default_offload


def _renamed(message: str, param: str | None, field: str | None) -> str:
    """An engine message that opens with ``param=value`` ("logprobs=30 is larger than ...")
    under the name the client sent it by (chat's top_logprobs)."""
    if param and field and field != param and message.startswith(f"{param}="):
        return field + message[len(param):]
    return message


class OpenAIServing:
    # The request field a prompt error is reported under (chat: "messages").
    prompt_field = "prompt"

    def __init__(self, engine: AsyncLLM, served_model_names: Sequence[str],
                 offload: Offload | None = None) -> None:
        self.engine = engine
        self.served_model_names = list(served_model_names)
        self.model_name = self.served_model_names[0]
        self.max_model_len = engine.model_config.max_model_len
        self.offload = offload or default_offload()

    def check_model(self, model: str | None) -> str:
        """The name to report back; 404 for a name this server does not serve."""
        if model is None or model == "":
            return self.model_name
        if model not in self.served_model_names:
            raise APIError(404, f"The model `{model[:200]}` does not exist. This server "
                           f"serves {self.served_model_names}.", param="model")
        return model

    def check_alive(self) -> None:
        if self.engine.errored:
            raise APIError(503, f"the engine is dead: {self.engine.dead_error!r}")

    async def prepare(self, prompts: Sequence[PromptType], params: SamplingParams,
                      aliases: Mapping[str, str] | None = None) -> list[PromptType]:
        """Tokenize text prompts and run the engine's own checks (vocabulary, limits, the
        context length) on a worker thread, before anything is queued: a bad prompt in a
        batch leaves nothing behind, a stream never starts with an error, and neither the
        event loop nor the engine thread tokenizes (token-id prompts of at most
        INLINE_MAX_IDS ids in all are checked on the event loop). Returns the prompts as
        ``{"prompt": text, "prompt_token_ids": ids}`` for the engine. ``aliases`` maps an
        engine field to the request field the client sent (chat: logprobs -> top_logprobs)."""
        processor = self.engine.engine.processor
        rename = {"prompt": self.prompt_field, "prompt_token_ids": self.prompt_field,
                  **(aliases or {})}

        def work() -> list[PromptType]:
            ready: list[PromptType] = []
            for i, prompt in enumerate(prompts):
                try:
                    ready.append(self._check_prompt(processor, prompt, params))
                except (ValueError, TypeError, OverflowError) as e:
                    prefix = f"prompt {i}: " if len(prompts) > 1 else ""
                    param = error_param(e)
                    field = rename.get(param, param)
                    raise APIError(400, prefix + _renamed(str(e), param, field),
                                   field) from None
            return ready

        try:
            if _inline(prompts):
                return work()
            return await self.offload.run(work)
        except EngineDeadError as e:
            raise APIError(503, str(e)) from None

    def _check_prompt(self, processor, prompt: PromptType,
                      params: SamplingParams) -> PromptType:
        """On a worker thread: the prompt tokenized (as the processor would) and checked."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "prompt is empty")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidRequestError("prompt", f"prompt holds text that is not valid "
                                          f"Unicode (a lone surrogate at index {e.start})"
                                          ) from None
            if processor.tokenizer is not None:
                prompt = {"prompt": prompt,
                          "prompt_token_ids": list(processor.tokenizer.encode(prompt))}
        req, _ = processor.process("validate", prompt, params)
        num_prompt = len(req.prompt_token_ids)
        # As vLLM's servers: prompt + max_tokens past the context is the client's error, not
        # a silent clamp (offline LLM.generate clamps instead).
        check_context_length(num_prompt, params.max_tokens, self.max_model_len)
        if params.min_tokens and num_prompt + params.min_tokens > self.max_model_len:
            raise InvalidRequestError(
                "min_tokens", f"min_tokens={params.min_tokens} cannot be generated: the prompt "
                f"has {num_prompt} tokens and the model's maximum context length is "
                f"{self.max_model_len}")
        return prompt

    async def json_response(self, build: Callable[[], Any], status: int = 200) -> Response:
        """A JSON response built and serialized on a worker thread: decoding logprobs for
        many tokens and dumping megabytes must not stall the event loop."""
        body = await self.offload.run(lambda: json_bytes(build()))
        return Response(body, status_code=status, media_type="application/json")

    def generate_all(self, prompts: Sequence[PromptType], params: SamplingParams,
                     request_id: str, priority: int = 0
                     ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of every prompt, tagged with the prompt index, as they come. The prompts
        of one HTTP request form one group: together they hold at most the scheduler's share
        of the batch while other requests wait."""
        # An engine that can send at once gets each request now, not when the response
        # first iterates (ReplicaRouter.start_request; OCTAVO_SERVER_EAGER_SEND=0: lazily).
        start = self.engine.generate
        if envs.server_eager_send():
            start = getattr(self.engine, "start_request", None) or start
        gens: list[AsyncIterator[RequestOutput]] = []
        try:
            for i, p in enumerate(prompts):
                gens.append(start(p, params, f"{request_id}-{i}", priority=priority,
                                  group_id=request_id))
        except BaseException as e:
            for i in range(len(gens)):  # the prompts sent before this one
                self.engine.abort(f"{request_id}-{i}")
            if isinstance(e, EngineDeadError):
                raise APIError(503, str(e)) from None
            raise
        return merge_async_iterators(gens)

    async def collect(self, results: AsyncIterator[tuple[int, RequestOutput]],
                      raw_request: Any | None,
                      poll_s: float = 0.5) -> dict[int, RequestOutput] | None:
        """The last output of each prompt, or None when the client went away first (the
        requests are then aborted, so their KV blocks return to the pool). A request that
        failed in the engine is a 500 naming it; the others went on."""
        finals: dict[int, RequestOutput] = {}

        async def consume() -> None:
            async for i, out in results:
                finals[i] = out

        task = asyncio.ensure_future(consume())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if done:
                    task.result()
                    return finals
                if raw_request is not None and await raw_request.is_disconnected():
                    return None
        except RequestFailedError as e:
            raise APIError(*failed_error(e)) from None
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await results.aclose()  # type: ignore[attr-defined]


async def merge_async_iterators(
        iterators: Sequence[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators. Leaving early (or an error in one) cancels the
    others, which closes them: a generate() stream then aborts its request."""
    if len(iterators) == 1:
        it = iterators[0]
        try:
            async for item in it:
                yield 0, item
        finally:
            await it.aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator[Any]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
            await queue.put((i, done))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(iterators)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def stream_error(e: BaseException) -> dict[str, Any]:
    """The OpenAI error body for an exception that ends a stream already under way."""
    if isinstance(e, APIError):
        return e.body()
    if isinstance(e, EngineDeadError):
        return error_body(503, str(e))
    if isinstance(e, RequestFailedError):
        return error_body(*failed_error(e))
    if isinstance(e, ValueError):
        return error_body(400, str(e), error_param(e))
    logger.error("stream ended by an unexpected error", exc_info=e)
    return error_body(500, f"internal error: {type(e).__name__}: {e}")


def engine_error_chunk(e: BaseException) -> str:
    """A stream that fails after its first byte cannot change its status: send the error."""
    return sse(stream_error(e))


class ErrorGuardMiddleware:
    """The outermost layer: any exception nothing else handled becomes a logged JSON 500 in
    OpenAI's shape (never a plain-text page or a dropped connection). Once a response has
    started nothing valid can be sent, so the exception goes on to the server."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            logger.exception("unhandled error serving %s %s", scope.get("method"),
                             scope.get("path"))
            if started:
                raise
            body = json_bytes(error_body(500, f"internal error: {type(e).__name__}: {e}"))
            await send({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nobody reads it


def now() -> int:
    return int(time.time())


def _inline(prompts: Sequence[PromptType]) -> bool:
    """Whether ``prepare`` checks these prompts on the event loop (INLINE_MAX_IDS)."""
    total = 0
    for p in prompts:
        if not isinstance(p, list):
            return False
        total += len(p)
        if total > INLINE_MAX_IDS:
            return False
    return True
