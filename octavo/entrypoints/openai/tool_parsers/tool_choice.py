"""tool_choice in chat completions: what constrains the output, and how the output becomes
OpenAI ``tool_calls``, whole or streamed.

* ``"none"``: plain text.
* a named function: the output is constrained (structured outputs) to that function's
  parameters schema; the text is the call's arguments.
* ``"required"``: the output is constrained to a JSON array of ``{"name", "parameters"}``
  objects, one schema per tool (at least one call; at most one without parallel calls).
* ``"auto"``: free text, read by the server's ``--tool-call-parser``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from octavo.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolCall, ToolParser
from octavo.structured_output.params import StructuredOutputsParams

# A function that declares no parameters takes any JSON object.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    return function.get("parameters") or _ANY_OBJECT


# Compact JSON for calls: free whitespace buys a client nothing in arguments, and small
# models spend their max_tokens on it (newlines between every token).
def named_tool_constraint(function: dict[str, Any]) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=_parameters(function), disable_any_whitespace=True)


def required_tools_constraint(functions: Sequence[dict[str, Any]],
                              parallel: bool = True) -> StructuredOutputsParams:
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]},
                             "parameters": _parameters(f)},
              "required": ["name", "parameters"]} for f in functions]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema, disable_any_whitespace=True)


def parse_required(text: str) -> list[ToolCall] | None:
    """The calls of a "required" output; None when it is not a complete array (cut by
    max_tokens)."""
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        calls.append(ToolCall(item["name"], json.dumps(item.get("parameters", {}),
                                                       ensure_ascii=False)))
    return calls


def _call_deltas(index: int, call: ToolCall) -> list[dict[str, Any]]:
    """OpenAI's stream shape: the id, type and name first, then the arguments."""
    return [{"tool_calls": [{"index": index, "id": call.id, "type": "function",
                             "function": {"name": call.name, "arguments": ""}}]},
            {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}]


class ToolCallHandler:
    """Turns one response's choices into messages (``message``) or stream deltas
    (``stream`` per text delta, ``finish`` at the end), for one tool_choice mode."""

    def __init__(self, mode: str, name: str | None = None,
                 parser_factory: Callable[[], ToolParser] | None = None) -> None:
        assert mode in ("named", "required", "auto"), mode
        self.mode = mode
        self.name = name
        self.parser_factory = parser_factory
        self._parsers: dict[int, ToolParser] = {}
        self._buffers: dict[int, str] = {}
        self._calls: dict[int, int] = {}  # choice -> calls streamed so far
        self._named_ids: dict[int, str] = {}

    # ------------------------------------------------------------------ whole outputs
    def message(self, text: str, finish_reason: str | None
                ) -> tuple[dict[str, Any], str | None]:
        """(assistant message, finish reason) for one finished choice."""
        calls: list[ToolCall] = []
        content: str | None = text
        if self.mode == "named":
            calls, content = [ToolCall(self.name, text)], None
        elif self.mode == "required":
            parsed = parse_required(text)
            if parsed is not None:
                calls, content = parsed, None
        else:
            extracted = self.parser_factory().extract(text)
            calls, content = extracted.tool_calls, extracted.content
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [c.to_dict() for c in calls]
            # As vLLM: a call the model chose (auto, required) ends with "tool_calls"; a
            # forced named call keeps the engine's reason, as OpenAI does.
            if self.mode != "named" and finish_reason == "stop":
                finish_reason = "tool_calls"
        return msg, finish_reason

    # ------------------------------------------------------------------ streaming
    def stream(self, index: int, delta: str) -> list[dict[str, Any]]:
        """Deltas to send for a choice's new text."""
        if self.mode == "named":
            out = []
            if index not in self._named_ids:
                call = ToolCall(self.name, "")
                self._named_ids[index] = call.id
                out.append(_call_deltas(0, call)[0])
            if delta:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": delta}}]})
            return out
        if self.mode == "required":  # a JSON array is only known complete at the end
            self._buffers[index] = self._buffers.get(index, "") + delta
            return []
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self.parser_factory()
        return self._emit(index, parser.stream(delta))

    def finish(self, index: int, finish_reason: str | None
               ) -> tuple[list[dict[str, Any]], str | None]:
        """(last deltas, finish reason) when a choice ends."""
        if self.mode == "named":
            out = self.stream(index, "") if index not in self._named_ids else []
            return out, finish_reason
        if self.mode == "required":
            text = self._buffers.pop(index, "")
            calls = parse_required(text)
            if calls is None:
                return ([{"content": text}] if text else []), finish_reason
            out = self._emit(index, calls)
        else:
            parser = self._parsers.pop(index, None)
            out = self._emit(index, parser.finish()) if parser is not None else []
        if self._calls.get(index) and finish_reason == "stop":
            finish_reason = "tool_calls"
        return out, finish_reason

    def _emit(self, index: int, items: Sequence[str | ToolCall]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for item in items:
            if isinstance(item, str):
                if item:
                    out.append({"content": item})
                continue
            n = self._calls.get(index, 0)
            self._calls[index] = n + 1
            out.extend(_call_deltas(n, item))
        return out
