"""The tool-parser interface and registry.

A parser instance serves one choice of one response: ``extract`` reads a whole output,
``stream`` is fed each text delta and returns what to send now (content text and whole tool
calls, in order), ``finish`` flushes at the end. Text that is not a well-formed call comes
back as content: a model's malformed call is the model's text, never a server error.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=tool_call_id)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ToolCall]

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


def parse_call(text: str) -> ToolCall | None:
    """``{"name": ..., "arguments": {...}}`` (or "parameters", vLLM's and Llama's key) ->
    a ToolCall; None when it is not one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # already JSON text (some models quote it)
        try:
            json.loads(args)
        except ValueError:
            return None
        return ToolCall(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolParser:
    """Base class: subclasses implement ``extract`` and the streaming pair."""

    name = ""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def extract(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def stream(self, delta: str) -> list[str | ToolCall]:
        """Content strings and completed tool calls to send for this delta, in order."""
        raise NotImplementedError

    def finish(self) -> list[str | ToolCall]:
        """What is still held back when the output ends."""
        raise NotImplementedError


_REGISTRY: dict[str, Callable[..., ToolParser]] = {}


def register_tool_parser(name: str, factory: Callable[..., ToolParser]) -> None:
    _REGISTRY[name] = factory


def tool_parser_names() -> list[str]:
    return sorted(_REGISTRY)


def get_tool_parser(name: str) -> Callable[..., ToolParser]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of "
                         f"{tool_parser_names()}")
    return _REGISTRY[name]
