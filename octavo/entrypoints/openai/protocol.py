"""Request bodies of the OpenAI-compatible API (pydantic), and the OpenAI error shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from octavo.sampling_params import RequestOutputKind, SamplingParams


class APIError(Exception):
    """An error returned to the client as {"error": {message, type, param, code}}."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             413: "RequestEntityTooLarge", 429: "RateLimitError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": APIError.TYPES.get(status, "APIError"),
                      "param": param, "code": status}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Sampling fields shared by completions and chat (OpenAI's plus vLLM's extras)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    # vLLM's extension: lower values are served first under --scheduling-policy priority.
    priority: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: str | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        stream: bool) -> SamplingParams:
        """SamplingParams for this request; APIError 400 naming the field when invalid."""
        try:
            return self._sampling_params(max_tokens, logprobs, stream)
        except ValueError as e:
            first = str(e).split(" ", 1)[0].split("=", 1)[0]
            param = first if first in type(self).model_fields else None
            raise APIError(400, str(e), param=param) from None

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         stream: bool) -> SamplingParams:
        kwargs: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k", "min_p"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return SamplingParams(
            **kwargs, n=self.n, max_tokens=max_tokens, seed=self.seed, stop=self.stop,
            stop_token_ids=self.stop_token_ids, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    chat_template: str | None = None
    add_generation_prompt: bool = True


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template; text parts of list content joined."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text":
                    raise APIError(400, f"messages[{i}]: only text content parts are supported, "
                                   f"got type={part.get('type')!r}", param="messages")
                texts.append(str(part.get("text", "")))
            content = "\n".join(texts)
        out.append({**(m.model_extra or {}), "role": m.role, "content": content or ""})
    return out
