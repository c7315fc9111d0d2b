"""The xgrammar backend (vLLM's default): compiles JSON schemas, regexes, EBNF / Lark grammars
and choices into token-level automata and fills bitmasks of the allowed next tokens."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from octavo import envs
from octavo.structured_output.backend import BackendUnavailableError, GrammarCompileError
from octavo.structured_output.params import StructuredOutputsParams

# With fill threads (OCTAVO_GRAMMAR_FILL_THREADS > 1), the rows go to xgrammar's thread pool
# from this many on; fewer are filled inline.
_BATCH_FILL_MIN = 8
# "[12:31:45] /project/cpp/regex_converter.cc:94: " in front of xgrammar's messages.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise BackendUnavailableError(
            "structured outputs need the xgrammar package: pip install 'octavo[structured]' "
            f"(or pip install xgrammar) ({e})") from None
    return xgrammar


def _message(e: BaseException) -> str:
    text = _CPP_PREFIX.sub("", str(e).strip())
    return text if len(text) <= 500 else text[:500] + "...(truncated)"


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF whose language is exactly ``choices``: JSON string escapes are EBNF's too."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def grammar_vocab_size(tokenizer: Any, logits_width: int, stop_token_ids: Sequence[int]) -> int:
    """The ids a grammar can allow: the tokenizer's (added tokens and stop ids included),
    never more than the model's logits width."""
    try:
        size = len(tokenizer)
    except TypeError:
        return logits_width
    return min(logits_width, max([size, *(t + 1 for t in stop_token_ids)]))


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 max_threads: int | None = None) -> None:
        xgr = import_xgrammar()
        # Compiling uses a few threads. Filling a step's rows is inline by default: for 32
        # rows of a JSON schema one thread takes 0.2 ms on the H200's host, and xgrammar's
        # 4-thread pool 2 ms (its hand-off costs more than the fills; benchmarks/bitmask_fill.py).
        compile_threads = max(1, min(4, os.cpu_count() or 1))
        if max_threads is None:
            max_threads = envs.grammar_fill_threads() or 1
        self._inline = max_threads == 1
        self._xgr = xgr
        if tokenizer is None:
            raise BackendUnavailableError("structured outputs need a tokenizer "
                                          "(skip_tokenizer_init=True was set)")
        # The bitmask covers the tokenizer's ids only, not the model's logits width: the
        # sampler disallows the ids past it. Handed the padded width (Qwen3's 151,936 logits
        # for a 49k tokenizer), xgrammar treats every padding id as a special token to reject
        # one by one: 2.5 ms instead of 0.1 ms for 32 rows of a JSON schema.
        self.vocab_size = grammar_vocab_size(tokenizer, vocab_size, stop_token_ids)
        # Bits past the vocabulary in the last word, which xgrammar leaves set.
        tail = self.vocab_size % 32
        self._last_word = None if tail == 0 else (1 << tail) - 1
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size,
            stop_token_ids=list(stop_token_ids) or None)
        # Our GrammarCache (bounded, remembers failures) is the one cache: xgrammar's own
        # is unbounded by default, which a server seeing many distinct schemas cannot afford.
        self.compiler = xgr.GrammarCompiler(info, max_threads=compile_threads,
                                             cache_enabled=False)
        self._batch = None if self._inline else xgr.BatchGrammarMatcher(max_threads=max_threads)

    # ------------------------------------------------------------------ compile
    def compile(self, params: StructuredOutputsParams) -> Any:
        compiled = self._compile(params)
        # A grammar whose language is empty ("root ::= root", a regex of an empty class)
        # compiles, then allows no first token: every request using it would fail in the
        # engine after a 200. One bitmask fill (cached with the grammar) refuses it here.
        mask = self.allocate_bitmask(1)
        self.fill_bitmask([self.new_matcher(compiled)], mask)
        if not bool(mask.any()):
            raise GrammarCompileError(f"the {params.kind} accepts no output (no token may "
                                      "start it)")
        return compiled

    def _compile(self, params: StructuredOutputsParams) -> Any:
        kind, spec = params.kind, params.spec
        c = self.compiler
        try:
            if kind == "json":
                if spec is True:
                    return c.compile_builtin_json_grammar()
                if spec is False:
                    raise GrammarCompileError("the JSON schema `false` accepts no output")
                return c.compile_json_schema(
                    json.dumps(spec), any_whitespace=not params.disable_any_whitespace,
                    strict_mode=True)
            if kind == "json_object":  # any JSON object, with whatever properties
                return c.compile_json_schema(
                    '{"type": "object"}', any_whitespace=not params.disable_any_whitespace,
                    strict_mode=False)
            if kind == "regex":
                return c.compile_regex(spec)
            if kind == "choice":
                return c.compile_grammar(choice_grammar(spec))
            if kind == "grammar":
                return self._compile_grammar(spec)
            if kind == "structural_tag":
                return c.compile_structural_tag(spec)
        except GrammarCompileError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar's RuntimeErrors: the input's fault
            raise GrammarCompileError(f"invalid {kind}: {_message(e)}") from None
        raise GrammarCompileError(f"unsupported constraint kind {kind!r}")

    def _compile_grammar(self, text: str) -> Any:
        """EBNF (GBNF, xgrammar's dialect) first; Lark (what vLLM's guidance backend and
        OpenAI's tools take) when that fails to parse."""
        try:
            return self.compiler.compile_grammar(text)
        except Exception as ebnf_error:  # noqa: BLE001
            try:
                return self.compiler.compile_grammar(self._xgr.Grammar.from_lark(text))
            except Exception:  # noqa: BLE001 - report the EBNF parser's complaint
                raise ebnf_error from None

    # ------------------------------------------------------------------ matching
    def new_matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> Any:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_bitmask(self, matchers: Sequence[Any], bitmask: Any) -> None:
        if len(matchers) >= _BATCH_FILL_MIN and not self._inline:
            self._batch.batch_fill_next_token_bitmask(list(matchers), bitmask)
        else:
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)
        if self._last_word is not None:
            bitmask[:, -1] &= self._last_word
