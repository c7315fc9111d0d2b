"""POST /v1/chat/completions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.chat_utils import apply_chat_template
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    NamedToolChoice,
    message_dicts,
)
from octavo.entrypoints.openai.serving_engine import (
    CLIENT_GONE_STATUS,
    DEFAULT_RENDER_TIMEOUT_S,
    ChunkFramer,
    Offload,
    OpenAIServing,
    RendersBusy,
    engine_error_chunk,
    finite_logprob,
    json_str,
    now,
    random_id,
    sse,
)
from octavo.entrypoints.openai.tool_parsers import get_tool_parser
from octavo.entrypoints.openai.tool_parsers.tool_choice import ToolCallHandler
from octavo.outputs import CompletionOutput, RequestOutput


class OpenAIServingChat(OpenAIServing):
    prompt_field = "messages"

    def __init__(self, engine: AsyncLLM, served_model_names: list[str],
                 chat_template: str | None = None, offload: Offload | None = None,
                 render_timeout: float = DEFAULT_RENDER_TIMEOUT_S,
                 tool_call_parser: str | None = None,
                 trust_request_chat_template: bool = False) -> None:
        super().__init__(engine, served_model_names, offload)
        self.trust_request_chat_template = trust_request_chat_template
        self.chat_template = chat_template or engine.model_config.chat_template
        self.render_timeout = render_timeout
        # tool_choice "auto": the parser that reads the model's tool-call text.
        self.tool_parser = (get_tool_parser(tool_call_parser) if tool_call_parser is not None
                            else None)

    async def render(self, messages, chat_template: str | None = None,
                     add_generation_prompt: bool = True,
                     tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Messages -> {"prompt", "prompt_token_ids"}; the template holds the special tokens.
        The template renders on its own thread within ``render_timeout`` seconds (a template
        is code, and a request may bring its own); the text is tokenized on a worker."""
        tokenizer = self.engine.get_tokenizer()
        # A template the request brought is at fault for its own errors; else the messages.
        param = "chat_template" if chat_template else "messages"

        def render_text() -> str:
            return apply_chat_template(tokenizer, message_dicts(messages),
                                       chat_template or self.chat_template,
                                       add_generation_prompt, tools=tools)

        try:
            text = await self.offload.run_bounded(render_text, self.render_timeout)
        except APIError:
            raise
        except TimeoutError:
            raise APIError(400, f"the chat template did not render within "
                           f"{self.render_timeout:g} s", param=param) from None
        except RendersBusy:
            raise APIError(503, "the server is busy rendering chat templates; retry later"
                           ) from None
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        except Exception as e:  # noqa: BLE001 - template errors are the client's input
            raise APIError(400, f"chat template failed: {e}", param=param) from None
        ids = await self.offload.run(lambda: tokenizer.encode(text, add_special_tokens=False))
        return {"prompt": text, "prompt_token_ids": list(ids)}

    async def create(self, req: ChatCompletionRequest, raw_request: Any | None = None):
        model = self.check_model(req.model)
        self.check_alive()
        req.check_tools(self.tool_parser is not None)
        if req.chat_template is not None and not self.trust_request_chat_template:
            raise APIError(400, "chat_template in a request is code the server would run; this "
                           "server refuses it (start it with --trust-request-chat-template to "
                           "accept templates from trusted clients)", param="chat_template")
        prompt = await self.render(req.messages, req.chat_template, req.add_generation_prompt,
                                   req.tool_dicts())
        tools = self._tool_handler(req)
        max_tokens = (req.max_completion_tokens if req.max_completion_tokens is not None
                      else req.max_tokens)
        num_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = req.sampling_params(max_tokens, num_logprobs, req.stream)
        # Engine fields under the names this request used for them.
        aliases = {"logprobs": "top_logprobs", **req.structured_aliases()}
        if req.max_completion_tokens is not None:
            aliases["max_tokens"] = "max_completion_tokens"
        prompt, = await self.prepare([prompt], params, aliases)
        request_id = random_id("chatcmpl")
        created = now()
        results = self.generate_all([prompt], params, request_id, req.priority)
        tokenizer = self.engine.get_tokenizer()
        top = req.top_logprobs or 0
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(results, model, request_id, created, tokenizer,
                             num_logprobs is not None, top, include_usage, req.n, tools),
                media_type="text/event-stream")
        finals = await self.collect(results, raw_request)
        if finals is None:
            return Response(status_code=CLIENT_GONE_STATUS)

        def build() -> dict[str, Any]:
            final = finals[0]
            comps = sorted(final.outputs, key=lambda c: c.index)
            p = len(final.prompt_token_ids or [])
            c = sum(len(comp.token_ids) for comp in comps)
            return {
                "id": request_id, "object": "chat.completion", "created": created,
                "model": model,
                "choices": [{
                    "index": comp.index,
                    **_message(comp, tools),
                    "logprobs": (_logprobs(comp, tokenizer, top)
                                 if num_logprobs is not None else None),
                    "stop_reason": comp.stop_reason}
                    for comp in comps],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}

        return await self.json_response(build)

    def _tool_handler(self, req: ChatCompletionRequest) -> ToolCallHandler | None:
        """How this request's output becomes tool calls (None: plain content)."""
        choice = req.effective_tool_choice()
        if not req.tools or choice == "none":
            return None
        if isinstance(choice, NamedToolChoice):
            return ToolCallHandler("named", name=choice.function.name)
        if choice == "required":
            return ToolCallHandler("required")
        tokenizer = self.engine.get_tokenizer()
        return ToolCallHandler("auto", parser_factory=lambda: self.tool_parser(tokenizer))

    async def _stream(self, results: AsyncIterator[tuple[int, RequestOutput]], model: str,
                      request_id: str, created: int, tokenizer, want_logprobs: bool,
                      top: int, include_usage: bool, n: int = 1,
                      tools: ToolCallHandler | None = None) -> AsyncIterator[str]:
        framer = ChunkFramer(request_id, "chat.completion.chunk", created, model)

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None,
                  logprobs: Any = None, stop_reason: Any = None) -> str:
            if (logprobs is None and finish is None and stop_reason is None
                    and len(delta) == 1 and type(delta.get("content")) is str):
                # The per-token hot path, built directly: json.dumps of the whole chunk
                # for every token of every stream was a good part of the server's time.
                return framer.event(f'{{"index":{index},"delta":{{"content":'
                                    f'{json_str(delta["content"])}}},"logprobs":null,'
                                    '"finish_reason":null,"stop_reason":null}')
            return framer.event(json.dumps({"index": index, "delta": delta,
                                            "logprobs": logprobs, "finish_reason": finish,
                                            "stop_reason": stop_reason}))

        prompt_tokens = completion_tokens = 0
        try:
            for index in range(n):
                yield chunk(index, {"role": "assistant", "content": ""})
            async for _, out in results:
                prompt_tokens = len(out.prompt_token_ids or [])
                for comp in out.outputs:
                    completion_tokens += len(comp.token_ids)
                    # Decoding every top token: off the event loop.
                    lp = (await self.offload.run(_logprobs, comp, tokenizer, top)
                          if want_logprobs else None)
                    if tools is not None:  # tool calls: deltas in OpenAI's shape
                        for delta in tools.stream(comp.index, comp.text):
                            yield chunk(comp.index, delta, logprobs=lp)
                            lp = None
                        if comp.finish_reason is not None:
                            last, reason = tools.finish(comp.index, comp.finish_reason)
                            for delta in last:
                                yield chunk(comp.index, delta)
                            yield chunk(comp.index, {}, reason, stop_reason=comp.stop_reason)
                        continue
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


def _message(comp: CompletionOutput, tools: ToolCallHandler | None) -> dict[str, Any]:
    """A finished choice's message and finish reason."""
    if tools is None:
        return {"message": {"role": "assistant", "content": comp.text},
                "finish_reason": comp.finish_reason}
    message, reason = tools.message(comp.text, comp.finish_reason)
    return {"message": message, "finish_reason": reason}


def _logprobs(comp: CompletionOutput, tokenizer, top: int) -> dict[str, Any]:
    def entry(tid: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([tid]) if tokenizer is not None else str(tid)
        return {"token": text, "logprob": finite_logprob(logprob),
                "bytes": list(text.encode("utf-8", "backslashreplace"))}

    content = []
    for tid, pos in zip(comp.token_ids, comp.logprobs or []):
        chosen = pos.get(tid)
        ranked = sorted(pos.items(), key=lambda kv: kv[1].rank or 0)[:top]
        content.append({**entry(tid, chosen.logprob if chosen else float("nan")),
                        "top_logprobs": [entry(k, v.logprob) for k, v in ranked]})
    return {"content": content}
