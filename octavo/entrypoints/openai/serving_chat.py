"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.chat_utils import apply_chat_template
from octavo.entrypoints.openai.protocol import APIError, ChatCompletionRequest, message_dicts
from octavo.entrypoints.openai.serving_engine import (
    CLIENT_GONE_STATUS,
    OpenAIServing,
    engine_error_chunk,
    now,
    random_id,
    sse,
)
from octavo.outputs import CompletionOutput, RequestOutput


class OpenAIServingChat(OpenAIServing):
    def __init__(self, engine: AsyncLLM, served_model_names: list[str],
                 chat_template: str | None = None) -> None:
        super().__init__(engine, served_model_names)
        self.chat_template = chat_template or engine.model_config.chat_template

    def render(self, messages, chat_template: str | None = None,
               add_generation_prompt: bool = True) -> dict[str, Any]:
        """Messages -> {"prompt", "prompt_token_ids"}; the template holds the special tokens."""
        tokenizer = self.engine.get_tokenizer()
        try:
            text = apply_chat_template(tokenizer, message_dicts(messages),
                                       chat_template or self.chat_template,
                                       add_generation_prompt)
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        except Exception as e:  # noqa: BLE001 - template errors are the client's input
            raise APIError(400, f"chat template failed: {e}", param="messages") from None
        return {"prompt": text,
                "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}

    async def create(self, req: ChatCompletionRequest, raw_request: Any | None = None):
        model = self.check_model(req.model)
        self.check_alive()
        prompt = self.render(req.messages, req.chat_template, req.add_generation_prompt)
        max_tokens = (req.max_completion_tokens if req.max_completion_tokens is not None
                      else req.max_tokens)
        num_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = req.sampling_params(max_tokens, num_logprobs, req.stream)
        await self.validate([prompt], params)
        request_id = random_id("chatcmpl")
        created = now()
        results = self.generate_all([prompt], params, request_id, req.priority)
        tokenizer = self.engine.get_tokenizer()
        top = req.top_logprobs or 0
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(results, model, request_id, created, tokenizer,
                             num_logprobs is not None, top, include_usage, req.n),
                media_type="text/event-stream")
        finals = await self.collect(results, raw_request)
        if finals is None:
            return Response(status_code=CLIENT_GONE_STATUS)
        final = finals[0]
        comps = sorted(final.outputs, key=lambda c: c.index)
        p = len(final.prompt_token_ids or [])
        c = sum(len(comp.token_ids) for comp in comps)
        return JSONResponse({
            "id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{
                "index": comp.index, "message": {"role": "assistant", "content": comp.text},
                "logprobs": (_logprobs(comp, tokenizer, top)
                             if num_logprobs is not None else None),
                "finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason}
                for comp in comps],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})

    async def _stream(self, results: AsyncIterator[tuple[int, RequestOutput]], model: str,
                      request_id: str, created: int, tokenizer, want_logprobs: bool,
                      top: int, include_usage: bool, n: int = 1) -> AsyncIterator[str]:
        def chunk(index: int, delta: dict[str, Any], finish: str | None = None,
                  logprobs: Any = None, stop_reason: Any = None) -> str:
            return sse({"id": request_id, "object": "chat.completion.chunk",
                        "created": created, "model": model,
                        "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish, "stop_reason": stop_reason}]})

        prompt_tokens = completion_tokens = 0
        try:
            for index in range(n):
                yield chunk(index, {"role": "assistant", "content": ""})
            async for _, out in results:
                prompt_tokens = len(out.prompt_token_ids or [])
                for comp in out.outputs:
                    completion_tokens += len(comp.token_ids)
                    lp = _logprobs(comp, tokenizer, top) if want_logprobs else None
                    if comp.text or lp:
                        yield chunk(comp.index, {"content": comp.text}, logprobs=lp)
                    if comp.finish_reason is not None:
                        yield chunk(comp.index, {}, comp.finish_reason,
                                    stop_reason=comp.stop_reason)
            if include_usage:
                yield sse({"id": request_id, "object": "chat.completion.chunk",
                           "created": created, "model": model, "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens,
                                     "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}})
        except Exception as e:  # noqa: BLE001 - the status is sent already: report in-band
            yield engine_error_chunk(e)
        finally:
            await results.aclose()  # type: ignore[attr-defined]
        yield sse("[DONE]")


def _logprobs(comp: CompletionOutput, tokenizer, top: int) -> dict[str, Any]:
    def entry(tid: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([tid]) if tokenizer is not None else str(tid)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for tid, pos in zip(comp.token_ids, comp.logprobs or []):
        chosen = pos.get(tid)
        ranked = sorted(pos.items(), key=lambda kv: kv[1].rank or 0)[:top]
        content.append({**entry(tid, chosen.logprob if chosen else float("nan")),
                        "top_logprobs": [entry(k, v.logprob) for k, v in ranked]})
    return {"content": content}
