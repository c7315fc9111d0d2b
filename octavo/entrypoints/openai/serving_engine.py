"""What the completions and chat handlers share: model-name checks, validation through the
engine, running several requests at once, SSE framing, error mapping."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from octavo.engine.async_llm import AsyncLLM, EngineDeadError
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.protocol import APIError, error_body
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, served_model_names: Sequence[str]) -> None:
        self.engine = engine
        self.served_model_names = list(served_model_names)
        self.model_name = self.served_model_names[0]
        self.max_model_len = engine.model_config.max_model_len

    def check_model(self, model: str | None) -> str:
        """The name to report back; 404 for a name this server does not serve."""
        if model is None or model == "":
            return self.model_name
        if model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                           f"{self.served_model_names}.", param="model")
        return model

    def check_alive(self) -> None:
        if self.engine.errored:
            raise APIError(503, f"the engine is dead: {self.engine.dead_error!r}")

    async def validate(self, prompts: Sequence[PromptType], params: SamplingParams) -> None:
        """Run the engine's own prompt and parameter checks before anything is queued, so a
        bad prompt in a batch leaves nothing behind and a stream never starts with an error."""
        def check(engine) -> None:
            for i, p in enumerate(prompts):
                try:
                    engine.processor.process("validate", p, params)
                except ValueError as e:
                    prefix = f"prompt {i}: " if len(prompts) > 1 else ""
                    raise ValueError(f"{prefix}{e}") from None

        try:
            await self.engine.run_in_engine(check)
        except ValueError as e:
            raise APIError(400, str(e), param="prompt" if "prompt" in str(e) else None) from None
        except EngineDeadError as e:
            raise APIError(503, str(e)) from None

    def generate_all(self, prompts: Sequence[PromptType], params: SamplingParams,
                     request_id: str, priority: int = 0
                     ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of every prompt, tagged with the prompt index, as they come."""
        gens = [self.engine.generate(p, params, f"{request_id}-{i}", priority=priority)
                for i, p in enumerate(prompts)]
        return merge_async_iterators(gens)

    async def collect(self, results: AsyncIterator[tuple[int, RequestOutput]],
                      raw_request: Any | None,
                      poll_s: float = 0.5) -> dict[int, RequestOutput] | None:
        """The last output of each prompt, or None when the client went away first (the
        requests are then aborted, so their KV blocks return to the pool)."""
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


def engine_error_chunk(e: BaseException) -> str:
    """A stream that fails after its first byte cannot change its status: send the error."""
    if isinstance(e, APIError):
        return sse(e.body())
    status = 503 if isinstance(e, EngineDeadError) else 400 if isinstance(e, ValueError) else 500
    return sse(error_body(status, str(e)))


CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nobody reads it


def now() -> int:
    return int(time.time())
