"""How much one request to the servers may send: caps on the lists behind per-request and
per-step work in the engine, so that a request with a million stop strings or a hundred
thousand prompts is a 400 (naming the field, the count and the limit) before anything is
validated item by item, tokenized or queued.

Server limits only: offline ``LLM.generate`` takes any number of prompts, stop strings and
so on from its own user. Each cap is generous next to real use (OpenAI's API takes at most 4
stop sequences); vLLM has none. Not capped here: ``logit_bias``, whose keys are distinct
token ids, each checked against the vocabulary before the request is queued.
"""

from __future__ import annotations

import json
from typing import Any

# Prompts in one completions request (strings or token-id lists): each is tokenized and
# becomes an engine request of its own.
MAX_PROMPTS = 1024
# Stop strings: each is searched for in the new text after every token.
MAX_STOP = 1024
# Characters of a request's stop strings together: after every token each one is searched
# for in a window of the text as long as the longest (1,024 strings of 8,000 characters:
# ~3 ms of the engine thread a step, which every request of the batch waits for).
MAX_STOP_CHARS = 2**16
# Words to ban: each is tokenized twice (alone and after a space) and indexed.
MAX_BAD_WORDS = 4096
# Stop token ids: copied into a set per request, and every step while short of min_tokens
# (the tokens to ban).
MAX_STOP_TOKEN_IDS = 1024
# Allowed token ids: de-duplicated, then a vocabulary mask built from them once per request.
# As many as the largest vocabularies hold (262,144 tokens): a longer list can only repeat
# ids.
MAX_ALLOWED_TOKEN_IDS = 2**18
# Chat messages (chat completions, /tokenize): each is validated and rendered by the chat
# template.
MAX_MESSAGES = 4096

# JSON values in the chat messages' fields other than role and content (name, tool_calls,
# tool_call_id, ... : they reach the chat template, and transformers walks every value of
# them before rendering, ~4.5 us each: 8 MB of nested lists in one such field took ~5 s of
# CPU). A long agent conversation's tool calls hold a few tens of thousands.
MAX_MESSAGE_EXTRA_VALUES = 2**16
# JSON values in a chat request's tools (their definitions reach the chat template, walked
# the same way).
MAX_TOOL_VALUES = 2**16

# Token ids one /detokenize request may send: more than any context holds (a 2**18 decode
# is ~0.07 s of the GIL; 1.5M ids took 0.39 s and 10 MB of text back).
MAX_DETOKENIZE_TOKENS = 2**18

# An output constraint's size: choices, and the characters of its regex, grammar, JSON schema
# (as JSON text) or choices together. Compiling one takes the offload pool's worker that
# validates the request (~4.5 s a MB of regex alternation; 200k choices took 22 s), and a
# few such requests would hold every worker, so no other request could be tokenized.
MAX_CHOICES = 8192
MAX_CONSTRAINT_CHARS = 256 * 1024

# Sampling fields both servers take -> the most entries a request may send.
LIST_LIMITS: dict[str, int] = {
    "stop": MAX_STOP,
    "bad_words": MAX_BAD_WORDS,
    "stop_token_ids": MAX_STOP_TOKEN_IDS,
    "allowed_token_ids": MAX_ALLOWED_TOKEN_IDS,
}


def stop_too_long(stop: Any) -> str | None:
    """Why a request's ``stop`` (a string or a list of them) is refused for its length, or
    None when it fits (other types are left to the field's own validation)."""
    items = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    total = sum(len(s) for s in items if isinstance(s, str))
    if total > MAX_STOP_CHARS:
        return (f"{total} characters of stop strings, more than this server's limit of "
                f"{MAX_STOP_CHARS} per request")
    return None


def too_many(value: Any, limit: int, what: str = "entries") -> str | None:
    """Why ``value`` (a request's list) is refused, or None when it fits. Anything but a list
    (a single stop string, a wrong type) is left to the field's own validation."""
    if isinstance(value, list) and len(value) > limit:
        return (f"{len(value)} {what}, more than this server's limit of {limit} per request")
    return None


def json_values(roots: Any, limit: int, count: int = 0) -> int:
    """``count`` plus the JSON values of ``roots`` (each root and all inside it; a mapping's
    keys count too), counted up to just past ``limit``: a huge value is not walked to its
    end. ``roots`` not a list (a field's wrong type, left to its validation): none."""
    if not isinstance(roots, list):
        return count
    if count + len(roots) > limit:
        return limit + 1
    stack = list(roots)
    while stack:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            count += len(v)  # the keys
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if count + len(items) > limit:
            return limit + 1
        stack.extend(items)
    return count


def message_extra_values(messages: Any, limit: int) -> int:
    """How many JSON values the messages' fields other than role and content hold (their
    keys too), counted up to just past ``limit``."""
    count = 0
    for m in messages if isinstance(messages, list) else ():
        if isinstance(m, dict):
            extra = [v for k, v in m.items() if k not in ("role", "content")]
            count = json_values(extra, limit, count + len(extra))
            if count > limit:
                return count
    return count


def constraint_too_big(so: Any) -> str | None:
    """Why a StructuredOutputsParams is refused (``MAX_CHOICES``, ``MAX_CONSTRAINT_CHARS``),
    or None when it fits."""
    if so is None:
        return None
    reason = too_many(so.choice, MAX_CHOICES, "choices")
    if reason is not None:
        return reason
    choices = so.choice or ()
    schema = so.json
    if schema is not None and not isinstance(schema, str):
        try:
            schema = json.dumps(schema)
        except (TypeError, ValueError):  # a model class (offline only): not a server's
            schema = ""
    size = sum(len(c) for c in choices) + sum(
        len(t) for t in (so.regex, so.grammar, schema, so.structural_tag) if t)
    if size > MAX_CONSTRAINT_CHARS:
        return (f"a constraint of {size} characters, more than this server's limit of "
                f"{MAX_CONSTRAINT_CHARS} per request")
    return None


def prompt_count(prompt: Any) -> int:
    """How many prompts a completions ``prompt`` holds: a list of token ids is one prompt,
    a list of strings or of token-id lists one per item."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1
