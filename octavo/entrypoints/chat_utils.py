"""Chat templates: conversations -> prompt text with the model's (or a given) template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Conversation = Sequence[Mapping[str, str]]


def validate_conversation(messages: Conversation) -> None:
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")


def apply_chat_template(tokenizer, messages: Conversation, chat_template: str | None = None,
                        add_generation_prompt: bool = True) -> str:
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was set)")
    validate_conversation(messages)
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the tokenizer has no chat template: pass chat_template=...")
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], chat_template=template, tokenize=False,
        add_generation_prompt=add_generation_prompt)
