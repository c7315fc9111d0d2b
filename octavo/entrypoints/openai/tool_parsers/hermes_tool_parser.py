"""The Hermes tool-call format, which the Qwen2.5 / Qwen3 (and Hermes 2 Pro) chat templates
ask for: each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, after any
plain text."""

from __future__ import annotations

import re

from octavo.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolCall,
    ToolParser,
    parse_call,
    register_tool_parser,
)

START, END = "<tool_call>", "</tool_call>"
# A call, closed or (the output ended first) running to the end of the text.
_CALL = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|\Z)", re.DOTALL)


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that starts ``tag`` (it may be completed by
    the next delta, so it is held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self, tokenizer=None) -> None:
        super().__init__(tokenizer)
        self._buf = ""
        self._in_call = False

    def extract(self, text: str) -> ExtractedToolCalls:
        if START not in text:
            return ExtractedToolCalls(text, [])
        calls = []
        for m in _CALL.finditer(text):
            call = parse_call(m.group(1).strip())
            if call is None:  # malformed: the whole output is the model's text
                return ExtractedToolCalls(text, [])
            calls.append(call)
        content = text[: text.index(START)]
        return ExtractedToolCalls(content if content.strip() else None, calls)

    def stream(self, delta: str) -> list[str | ToolCall]:
        self._buf += delta
        out: list[str | ToolCall] = []
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i < 0:
                    keep = _held_prefix(self._buf, START)
                    text, self._buf = self._buf[: len(self._buf) - keep], self._buf[
                        len(self._buf) - keep:]
                    if text:
                        out.append(text)
                    return out
                if i:
                    out.append(self._buf[:i])
                self._buf = self._buf[i + len(START):]
                self._in_call = True
            j = self._buf.find(END)
            if j < 0:
                return out  # the call is not complete yet
            body, self._buf = self._buf[:j], self._buf[j + len(END):]
            self._in_call = False
            call = parse_call(body.strip())
            out.append(call if call is not None else START + body + END)

    def finish(self) -> list[str | ToolCall]:
        buf, self._buf = self._buf, ""
        if not self._in_call:
            return [buf] if buf else []
        self._in_call = False
        call = parse_call(buf.strip())  # the output ended before the closing tag
        return [call] if call is not None else [START + buf]


register_tool_parser("hermes", HermesToolParser)
