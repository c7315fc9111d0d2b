"""POST /v1/completions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from octavo.engine.beam_runner import validation_params
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.protocol import CompletionRequest
from octavo.entrypoints.openai.serving_engine import (
    CLIENT_GONE_STATUS,
    ChunkFramer,
    OpenAIServing,
    engine_error_chunk,
    finite_logprob,
    json_str,
    json_value,
    now,
    random_id,
    sse,
)
from octavo.outputs import CompletionOutput, RequestOutput


def _prompts(prompt: Any) -> list[PromptType]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if isinstance(prompt[0], int):  # token ids (validated: all of them, one prompt)
        return [list(prompt)]
    return [p if isinstance(p, str) else list(p) for p in prompt]


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest, raw_request: Any | None = None):
        model = self.check_model(req.model)
        self.check_alive()
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs needs prompt logprobs, not supported yet",
                           param="echo")
        prompts = _prompts(req.prompt)
        params = req.sampling_params(req.max_tokens, req.logprobs, req.stream)
        # Beam search runs above the engine: the processor checks the rest of it.
        prompts = await self.prepare(prompts, validation_params(self.engine.engine, params),
                                     req.structured_aliases())
        request_id = random_id("cmpl")
        created = now()
        tokenizer = self.engine.get_tokenizer()
        results = self.generate_all(prompts, params, request_id, req.priority)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(results, req, model, request_id, created, tokenizer,
                             req.n, include_usage),
                media_type="text/event-stream")
        finals = await self.collect(results, raw_request)
        if finals is None:
            return Response(status_code=CLIENT_GONE_STATUS)

        def build() -> dict[str, Any]:
            choices, prompt_tokens, completion_tokens = [], 0, 0
            for i in range(len(prompts)):
                out = finals[i]
                for comp in sorted(out.outputs, key=lambda c: c.index):
                    text = comp.text
                    if req.echo:
                        text = _prompt_text(out, tokenizer) + text
                    choices.append(_choice(i * req.n + comp.index, text, comp, tokenizer,
                                           req.logprobs))
                    completion_tokens += len(comp.token_ids)
                prompt_tokens += len(out.prompt_token_ids or [])
            return {
                "id": request_id, "object": "text_completion", "created": created,
                "model": model, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

        return await self.json_response(build)

    async def _stream(self, results: AsyncIterator[tuple[int, RequestOutput]],
                      req: CompletionRequest, model: str, request_id: str, created: int,
                      tokenizer, n: int, include_usage: bool) -> AsyncIterator[str]:
        """One chunk per sample per output; choice index = prompt index * n + sample index.
        Prompt tokens count once per prompt, completion tokens over every sample."""
        prompt_tokens: dict[int, int] = {}
        completion_tokens = 0
        offsets: dict[int, int] = {}
        echoed: set[int] = set()
        framer = ChunkFramer(request_id, "text_completion", created, model)
        try:
            async for i, out in results:
                prompt_tokens[i] = len(out.prompt_token_ids or [])
                for comp in out.outputs:
                    index = i * n + comp.index
                    text = comp.text
                    if req.echo and index not in echoed:
                        text = _prompt_text(out, tokenizer) + text
                        echoed.add(index)
                    completion_tokens += len(comp.token_ids)
                    if req.logprobs is None:  # the per-token hot path: no dict, no dumps
                        yield framer.event(_choice_json(index, text, comp))
                        continue
                    offset = offsets.get(index, 0)
                    # Decoding every top token: off the event loop.
                    choice = await self.offload.run(_choice, index, text, comp, tokenizer,
                                                    req.logprobs, offset)
                    offsets[index] = offset + len(text)
                    yield framer.event(json.dumps(choice))
            if include_usage:
                p, c = sum(prompt_tokens.values()), completion_tokens
                yield sse({"id": request_id, "object": "text_completion", "created": created,
                           "model": model, "choices": [],
                           "usage": {"prompt_tokens": p, "completion_tokens": c,
                                     "total_tokens": p + c}})
        except Exception as e:  # noqa: BLE001 - the status is sent already: report in-band
            yield engine_error_chunk(e)
        finally:
            await results.aclose()  # type: ignore[attr-defined]
        yield sse("[DONE]")


def _prompt_text(out: RequestOutput, tokenizer) -> str:
    if out.prompt is not None:
        return out.prompt
    return tokenizer.decode(out.prompt_token_ids or []) if tokenizer is not None else ""


def _choice_json(index: int, text: str, comp: CompletionOutput) -> str:
    """``json.dumps(_choice(index, text, comp, None, None))``, compact, built directly."""
    return (f'{{"index":{index},"text":{json_str(text)},"logprobs":null,"finish_reason":'
            f'{json_value(comp.finish_reason)},"stop_reason":{json_value(comp.stop_reason)}}}')


def _choice(index: int, text: str, comp: CompletionOutput, tokenizer, num_logprobs: int | None,
            text_offset: int = 0) -> dict[str, Any]:
    return {"index": index, "text": text,
            "logprobs": (_logprobs(comp, tokenizer, text_offset)
                         if num_logprobs is not None else None),
            "finish_reason": comp.finish_reason, "stop_reason": comp.stop_reason}


def _logprobs(comp: CompletionOutput, tokenizer, offset: int) -> dict[str, Any]:
    tokens, token_logprobs, top, offsets = [], [], [], []

    def tok(tid: int) -> str:
        return tokenizer.decode([tid]) if tokenizer is not None else str(tid)

    for tid, entry in zip(comp.token_ids, comp.logprobs or []):
        t = tok(tid)
        tokens.append(t)
        token_logprobs.append(finite_logprob(entry[tid].logprob) if tid in entry else None)
        top.append({tok(k): finite_logprob(v.logprob) for k, v in entry.items()})
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}
