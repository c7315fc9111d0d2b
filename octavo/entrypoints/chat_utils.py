"""Chat templates: conversations -> prompt text with the model's (or a given) template."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from octavo.errors import InvalidRequestError, short_repr

Conversation = Sequence[Mapping[str, str]]


def validate_conversation(messages: Conversation) -> None:
    """Each message a dict with a string ``role`` and a ``content`` that is text, None or a
    list of content parts (dicts): anything else reached the template, which failed with a
    bare TypeError or rendered the value's repr."""
    if not messages:
        raise InvalidRequestError("messages", "messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidRequestError(
                "messages", f"messages[{i}] must be a dict with 'role' and 'content', "
                f"got {_short(m)}")
        if not isinstance(m["role"], str):
            raise InvalidRequestError(
                "messages", f"messages[{i}].role must be a string, got {_short(m['role'])}")
        content = m["content"]
        if not (content is None or isinstance(content, str) or (
                isinstance(content, list) and all(isinstance(p, Mapping) for p in content))):
            raise InvalidRequestError(
                "messages", f"messages[{i}].content must be a string, None or a list of "
                f"content parts (dicts), got {_short(content)}")


def _short(value: Any) -> str:
    return f"{short_repr(value)} ({type(value).__name__})"


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: OpenAI sends a tool call's arguments as JSON
    text, while templates (Qwen's, Hermes') render them as a mapping with ``tojson``."""
    out = dict(message)
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                try:
                    args = json.loads(fn["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    call = {**call, "function": {**fn, "arguments": args}}
            fixed.append(call)
        out["tool_calls"] = fixed
    return out


def apply_chat_template(tokenizer, messages: Conversation, chat_template: str | None = None,
                        add_generation_prompt: bool = True,
                        tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """``tools``: OpenAI tool definitions, handed to the template (as transformers does)."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was set)")
    validate_conversation(messages)
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the tokenizer has no chat template: pass chat_template=...")
    extra = {"tools": [dict(t) for t in tools]} if tools else {}
    return tokenizer.apply_chat_template(
        [_template_message(m) for m in messages], chat_template=template, tokenize=False,
        add_generation_prompt=add_generation_prompt, **extra)
