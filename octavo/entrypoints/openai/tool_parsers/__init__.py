"""Tool-call parsers for chat completions with ``tool_choice="auto"``: the model writes its
calls as text in its own format; a parser (chosen by ``--tool-call-parser``) turns that text
into OpenAI ``tool_calls``, whole or streamed."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolCall,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    tool_parser_names,
)
from octavo.entrypoints.openai.tool_parsers.hermes_tool_parser import HermesToolParser

__all__ = ["ExtractedToolCalls", "HermesToolParser", "ToolCall", "ToolParser",
           "get_tool_parser", "register_tool_parser", "tool_parser_names"]
