"""The grammar backend interface and its registry.

A backend turns a request's ``StructuredOutputsParams`` into a compiled grammar (once per
distinct constraint: the manager caches it) and a compiled grammar into per-request matchers.
New backends register a factory here; the engine picks one by name
(``structured_outputs_config.backend``, the server's ``--guided-decoding-backend``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from octavo.structured_output.params import StructuredOutputsParams


class GrammarCompileError(ValueError):
    """The constraint is malformed or unsupported (the request's fault: a 400)."""


class BackendUnavailableError(RuntimeError):
    """The backend's library is not installed."""


class Matcher(Protocol):
    """One request's position in its grammar."""

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...


class StructuredOutputBackend(Protocol):
    """Compiles constraints for one tokenizer / vocabulary and fills token bitmasks."""

    name: str
    # The token ids the bitmask covers: at most the model's logits width, often less (the
    # tokenizer's vocabulary); the sampler disallows the ids past it.
    vocab_size: int

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar; GrammarCompileError when the constraint is malformed."""

    def new_matcher(self, compiled: Any) -> Matcher: ...

    def allocate_bitmask(self, rows: int) -> Any:
        """An int32 tensor [rows, ceil(vocab_size / 32)], every token allowed."""

    def fill_bitmask(self, matchers: Sequence[Matcher], bitmask: Any) -> None:
        """Row i of ``bitmask`` <- the tokens ``matchers[i]`` allows next."""


# name -> factory(tokenizer, vocab_size, stop_token_ids) -> backend
BackendFactory = Callable[[Any, int, Sequence[int]], StructuredOutputBackend]
_REGISTRY: dict[str, BackendFactory] = {}
# What "auto" means: the default backend, as in vLLM.
DEFAULT_BACKEND = "xgrammar"


def register_backend(name: str, factory: BackendFactory) -> None:
    _REGISTRY[name] = factory


def backend_names() -> list[str]:
    return sorted(_REGISTRY) + ["auto"]


def resolve_backend_name(name: str | None) -> str:
    """A registered backend's name; ValueError naming the choices otherwise."""
    name = DEFAULT_BACKEND if name in (None, "auto") else name
    if name not in _REGISTRY:
        raise ValueError(f"unknown structured outputs backend {name!r}; choose one of "
                         f"{backend_names()}")
    return name


def create_backend(name: str | None, tokenizer: Any, vocab_size: int,
                   stop_token_ids: Sequence[int]) -> StructuredOutputBackend:
    return _REGISTRY[resolve_backend_name(name)](tokenizer, vocab_size, stop_token_ids)


def _xgrammar(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]):
    from octavo.structured_output.xgrammar_backend import XgrammarBackend

    return XgrammarBackend(tokenizer, vocab_size, stop_token_ids)


register_backend("xgrammar", _xgrammar)
