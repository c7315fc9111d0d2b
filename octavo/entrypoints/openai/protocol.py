"""Request bodies of the OpenAI-compatible API (pydantic); the error shape is errors.py's.

Every field is strict: a boolean is not an integer or a token id, ``"yes"`` is not ``true``,
``1.5`` is not an integer and ``"0.5"`` is not a number (float fields still take JSON
integers). Integers are bounded here, so the OpenAPI schema says so and a 2**63 is a 400
naming its field instead of an overflow deep in the engine; limits that depend on the model
(vocabulary, ``max_logprobs``, ``max_n``, the context) are the engine processor's. Lists
whose items cost the engine work (prompts, stop strings, bad words, token ids, messages) are
capped too (``octavo.entrypoints.request_limits``), checked before their items. Text
must be encodable as UTF-8: a lone surrogate such as ``"\\ud800"`` is refused by name.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    StrictBool,
    Tag,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from octavo.entrypoints.openai.errors import APIError, error_param
from octavo.entrypoints.request_limits import (
    LIST_LIMITS,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_CHOICES,
    MAX_DETOKENIZE_TOKENS,
    MAX_MESSAGE_EXTRA_VALUES,
    MAX_MESSAGES,
    MAX_PROMPTS,
    MAX_STOP,
    MAX_STOP_TOKEN_IDS,
    MAX_TOOL_VALUES,
    constraint_too_big,
    json_values,
    message_extra_values,
    prompt_count,
    stop_too_long,
    too_many,
)
from octavo.errors import InvalidRequestError
from octavo.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from octavo.structured_output.params import KINDS as STRUCTURED_KINDS
from octavo.structured_output.params import as_structured_outputs

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# ------------------------------------------------------------------ strict field types
def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text that is not valid Unicode (a lone surrogate at index "
                         f"{e.start})") from None
    return text


def _all_encodable(value: Any, depth: int = 0) -> Any:
    """Every string in a JSON value (keys too) encodable; for free-form parts of a message."""
    if isinstance(value, str):
        _encodable(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _all_encodable(k, depth + 1)
            _all_encodable(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _all_encodable(v, depth + 1)
    return value


Text = Annotated[str, Strict(), AfterValidator(_encodable)]
# JSON integers are welcome in float fields; booleans, strings, NaN and infinities are not.
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Count = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
NonNegInt = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
# Ids are bounded by the vocabulary at the engine; int32 here keeps huge ones out.
TokenId = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
Int64 = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]
_DIGITS = re.compile(r"[0-9]{1,10}")


def _refuse_too_many(value: Any, limit: int, what: str = "entries") -> Any:
    """``value`` unless it is a list longer than ``limit`` (request_limits): checked before
    pydantic validates a million items one by one on the event loop."""
    reason = too_many(value, limit, what)
    if reason is not None:
        raise PydanticCustomError("too_long", reason)
    return value


def _values_capped(count, limit: int, what: str) -> BeforeValidator:
    """A cap on the JSON values ``count(value, limit)`` finds in a field (request_limits),
    checked before pydantic validates them."""
    def check(value: Any) -> Any:
        if count(value, limit) > limit:
            raise PydanticCustomError("too_long", f"{what} hold more than this server's limit "
                                      f"of {limit} JSON values per request")
        return value
    return BeforeValidator(check)


# Fields besides role and content reach the chat template, as do tools' definitions.
_EXTRAS_CAPPED = _values_capped(
    message_extra_values, MAX_MESSAGE_EXTRA_VALUES,
    "the messages' fields other than role and content (name, tool_calls, ...)")
_TOOLS_CAPPED = _values_capped(json_values, MAX_TOOL_VALUES, "the tools' definitions")


def _bounded(so: StructuredOutputsParams | None, field: str | None
             ) -> StructuredOutputsParams | None:
    """``so`` unless it is larger than a server compiles (request_limits)."""
    reason = constraint_too_big(so)
    if reason is not None:
        raise APIError(400, f"{field}: {reason}", param=field)
    return so


def _capped(limit: int, what: str) -> BeforeValidator:
    """A list type's cap (its ``Field(max_length=...)`` states it in the schema), checked
    before the items."""
    return BeforeValidator(lambda value: _refuse_too_many(value, limit, what))


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema. The schema is always enforced: ``strict`` is
    accepted for compatibility (structured outputs never produce off-schema JSON)."""

    model_config = ConfigDict(populate_by_name=True)

    name: Text | None = None
    description: Text | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


# Request fields that constrain the output, each a way to say the same thing.
STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar")


class _SamplingRequest(BaseModel):
    """Sampling fields shared by completions and chat (OpenAI's plus vLLM's extras)."""

    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    n: Count = 1
    # vLLM's extension: sample best_of, return the n most likely.
    best_of: Count | None = None
    temperature: Annotated[Float, Field(ge=0)] | None = None
    top_p: Annotated[Float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Strict(), Field(ge=-1, le=INT32_MAX)] | None = None
    min_p: Annotated[Float, Field(ge=0, le=1)] | None = None
    # Any 64-bit seed, signed or not (vLLM's range).
    seed: Annotated[int, Strict(), Field(ge=INT64_MIN, le=2**64 - 1)] | None = None
    # vLLM's extension: lower values are served first under --scheduling-policy priority.
    priority: Int64 = 0
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[Float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[Float, Field(ge=-2, le=2)] = 0.0
    repetition_penalty: Annotated[Float, Field(gt=0)] = 1.0
    ignore_eos: StrictBool = False
    min_tokens: NonNegInt = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    user: Text | None = None
    # OpenAI's field: token id (a string of digits, JSON keys being strings) -> bias.
    logit_bias: dict[Text, Annotated[Float, Field(ge=-100, le=100)]] | None = None
    allowed_token_ids: Annotated[list[TokenId],
                                 Field(max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    bad_words: Annotated[list[Text], Field(max_length=MAX_BAD_WORDS)] | None = None
    # Keep only the last k prompt tokens (-1: the model's maximum length).
    truncate_prompt_tokens: Annotated[int, Strict(), Field(ge=-1, le=INT32_MAX)] | None = None
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs (the fields of
    # StructuredOutputsParams) and its older guided_* fields. At most one of them.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Text | dict[str, Any] | None = None
    guided_regex: Text | None = None
    guided_choice: Annotated[list[Text], Field(max_length=MAX_CHOICES),
                             _capped(MAX_CHOICES, "choices")] | None = None
    guided_grammar: Text | None = None
    guided_decoding_backend: Text | None = None
    guided_whitespace_pattern: Text | None = None

    @field_validator(*LIST_LIMITS, mode="before")
    @classmethod
    def _list_limits(cls, value: Any, info: ValidationInfo) -> Any:
        # Before the union (stop: a string or a list) reports its first member's error.
        value = _refuse_too_many(value, LIST_LIMITS[info.field_name])
        reason = stop_too_long(value) if info.field_name == "stop" else None
        if reason is not None:
            raise PydanticCustomError("too_long", reason)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, bias: dict[str, float] | None) -> dict[int, float] | None:
        if bias is None:
            return None
        out: dict[int, float] = {}
        for key, value in bias.items():
            if not _DIGITS.fullmatch(key):
                raise ValueError(f"keys must be token ids written in decimal digits, got "
                                 f"{key[:20]!r}")
            out[int(key)] = value
        return out

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        stream: bool) -> SamplingParams:
        """SamplingParams for this request; APIError 400 naming the field when invalid."""
        try:
            return self._sampling_params(max_tokens, logprobs, stream)
        except (ValueError, TypeError, OverflowError) as e:
            param = error_param(e)
            if param is not None and param not in type(self).model_fields:
                param = None
            raise APIError(400, str(e), param=param) from None

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         stream: bool, **extra: Any) -> SamplingParams:
        """``extra``: a subclass's own SamplingParams fields (they override the sampling
        knobs), validated in the one construction."""
        kwargs: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k", "min_p"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        kwargs.update(extra)
        return SamplingParams(
            **kwargs, n=self.n, best_of=self.best_of, max_tokens=max_tokens, seed=self.seed,
            stop=self.stop, stop_token_ids=self.stop_token_ids,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias, allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words, truncate_prompt_tokens=self.truncate_prompt_tokens,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            structured_outputs=self.structured_outputs_params())

    def structured_source(self) -> str | None:
        """The request field that constrains the output (None: free text). 400 when a
        request uses several."""
        given = [f for f in STRUCTURED_FIELDS if getattr(self, f) is not None
                 and not (f == "response_format" and self.response_format.type == "text")]
        if len(given) > 1:
            raise APIError(400, f"use one of {', '.join(given)} to constrain the output, "
                           "not several", param=given[1])
        return given[0] if given else None

    def structured_aliases(self) -> dict[str, str]:
        """Engine error fields (a grammar that does not compile: "structured_outputs.json")
        -> the request field that brought the constraint."""
        source = self.structured_source()
        if source is None:
            return {}
        names = ("", *(f".{k}" for k in STRUCTURED_KINDS), ".backend")
        return {f"structured_outputs{n}": source for n in names}

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The output constraint this request asks for, errors named by its own field."""
        source = self.structured_source()
        return _bounded(self._constraint(source), source)

    def _constraint(self, source: str | None) -> StructuredOutputsParams | None:
        if source is None:
            return None
        extra: dict[str, Any] = {}
        if self.guided_decoding_backend is not None:
            extra["backend"] = self.guided_decoding_backend
        if self.guided_whitespace_pattern is not None:
            extra["whitespace_pattern"] = self.guided_whitespace_pattern
        try:
            if source == "response_format":
                fmt = self.response_format
                if fmt.type == "json_object":
                    return StructuredOutputsParams(json_object=True, **extra)
                if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                    raise APIError(400, "response_format of type json_schema needs "
                                   "json_schema.schema", param="response_format")
                return StructuredOutputsParams(json=fmt.json_schema.json_schema, **extra)
            if source == "structured_outputs":
                return as_structured_outputs("structured_outputs",
                                             {**extra, **self.structured_outputs})
            kind = source.removeprefix("guided_")
            return StructuredOutputsParams(**{kind: getattr(self, source)}, **extra)
        except InvalidRequestError as e:
            raise APIError(400, str(e), param=source) from None


def _prompt_form(value: Any) -> str:
    """Which form of ``prompt`` a value is, from its first item: only that form is validated.
    (An undiscriminated union tried every form, and a list of 1,024 token ids failed as a list
    of strings item by item first: the request validated in 171 us against 57 now, on the
    event loop.)"""
    if isinstance(value, list) and value:
        first = value[0]
        return "texts" if isinstance(first, str) else "id_lists" if isinstance(first, list) \
            else "ids"
    return "ids" if isinstance(value, list) else "text"


_PROMPT_TEXTS = Annotated[list[Text], Field(max_length=MAX_PROMPTS)]
_PROMPT_ID_LISTS = Annotated[list[list[TokenId]], Field(max_length=MAX_PROMPTS)]
# The schema states the forms as "anyOf", as OpenAI's does (an empty list is more than one).
_PROMPT_SCHEMA = TypeAdapter(Text | _PROMPT_TEXTS | list[TokenId] | _PROMPT_ID_LISTS
                             ).json_schema()


class CompletionRequest(_SamplingRequest):
    prompt: Annotated[
        Annotated[Text, Tag("text")] | Annotated[_PROMPT_TEXTS, Tag("texts")]
        | Annotated[list[TokenId], Tag("ids")] | Annotated[_PROMPT_ID_LISTS, Tag("id_lists")],
        Discriminator(_prompt_form), WithJsonSchema(_PROMPT_SCHEMA)]
    max_tokens: Count | None = 16
    echo: StrictBool = False
    logprobs: NonNegInt | None = None
    suffix: Text | None = None
    # vLLM's beam search extras: a search of width best_of (default n) returning the n best
    # beams. Beams are ranked by the raw logprobs, so temperature and the other sampling
    # knobs are ignored (as in vLLM); streamed, the beams arrive in one final chunk.
    use_beam_search: StrictBool = False
    length_penalty: Float = 1.0
    early_stopping: StrictBool | Literal["never"] = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_limit(cls, value: Any) -> Any:
        if prompt_count(value) > 1:  # (a list of token ids is one prompt, of any length)
            _refuse_too_many(value, MAX_PROMPTS, "prompts")
        return value

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         stream: bool, **extra: Any) -> SamplingParams:
        beam: dict[str, Any] = {"temperature": 0.0} if self.use_beam_search else {}
        # In the one construction: a dataclasses.replace after it validated everything
        # twice (24.0 -> 11.5 us a request here).
        return super()._sampling_params(max_tokens, logprobs, stream, **{
            **beam, "use_beam_search": self.use_beam_search,
            "length_penalty": self.length_penalty, "early_stopping": self.early_stopping,
            **extra})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Text
    content: Text | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _encodable_parts(self) -> ChatMessage:
        # Content parts and extra keys (name, tool_calls, ...) reach the chat template.
        if isinstance(self.content, list):
            _all_encodable(self.content)
        _all_encodable(self.model_extra or {})
        return self


class FunctionDefinition(BaseModel):
    name: Annotated[Text, Field(min_length=1, max_length=256)]
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _encodable_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _all_encodable(value)


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: Text


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES),
                        # (before-validators run last first: the count cap, then this)
                        _EXTRAS_CAPPED, _capped(MAX_MESSAGES, "messages")]
    # Tool calls: the tools reach the chat template; tool_choice "required" and a named
    # function are enforced with structured outputs, "auto" is parsed (--tool-call-parser).
    tools: Annotated[list[ChatTool], _TOOLS_CAPPED] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: StrictBool = False
    top_logprobs: NonNegInt | None = None
    chat_template: Text | None = None
    add_generation_prompt: StrictBool = True

    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: "auto" when tools are given, else "none"."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (OpenAI's shape)."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def check_tools(self, auto_parser: bool) -> None:
        """400 naming tool_choice when it cannot be served."""
        choice = self.effective_tool_choice()
        if choice == "none" or (choice == "auto" and not self.tools):
            return
        if not self.tools:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in self.tools]
            if choice.function.name not in names:
                raise APIError(400, f"tool_choice names the function "
                               f"{choice.function.name[:80]!r}, which is not among the "
                               f"tools {names[:20]}", param="tool_choice")
        elif choice == "auto" and not auto_parser:
            raise APIError(400, '"auto" tool choice needs the server to run with '
                           "--tool-call-parser (e.g. hermes); use tool_choice \"required\" "
                           "or a named function otherwise", param="tool_choice")

    def _forced_tools(self) -> StructuredOutputsParams | None:
        from octavo.entrypoints.openai.tool_parsers.tool_choice import (
            named_tool_constraint,
            required_tools_constraint,
        )

        choice = self.effective_tool_choice()
        if not self.tools or choice in ("none", "auto"):
            return None
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools]
        try:
            if isinstance(choice, NamedToolChoice):
                fn = next(f for f in functions if f["name"] == choice.function.name)
                return named_tool_constraint(fn)
            return required_tools_constraint(functions, self.parallel_tool_calls is not False)
        except (InvalidRequestError, StopIteration) as e:
            raise APIError(400, f"tools: {e}", param="tools") from None

    def structured_source(self) -> str | None:
        source = super().structured_source()
        if self.tools and (self.effective_tool_choice() == "required"
                           or isinstance(self.tool_choice, NamedToolChoice)):
            if source is not None:
                raise APIError(400, f"tool_choice {self.effective_tool_choice()!r} cannot be "
                               f"combined with {source}", param=source)
            return "tool_choice"
        return source

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        if self.structured_source() == "tool_choice":
            return _bounded(self._forced_tools(), "tools")
        return super().structured_outputs_params()


class TokenizeRequest(BaseModel):
    model: Text | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES),
                        _EXTRAS_CAPPED, _capped(MAX_MESSAGES, "messages")] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model: Text | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_DETOKENIZE_TOKENS),
                      _capped(MAX_DETOKENIZE_TOKENS, "token ids")]


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template; text parts of list content joined."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise APIError(400, f"messages[{i}]: only text content parts are supported, "
                                   f"got type={str(kind)[:40]!r}", param="messages")
                text = part.get("text", "")
                if not isinstance(text, str):
                    raise APIError(400, f"messages[{i}]: a text part's text must be a string, "
                                   f"got {type(text).__name__}", param="messages")
                texts.append(text)
            content = "\n".join(texts)
        out.append({**(m.model_extra or {}), "role": m.role, "content": content or ""})
    return out
