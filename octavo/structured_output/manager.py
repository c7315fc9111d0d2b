"""StructuredOutputManager: compiles request constraints (cached), makes per-request grammar
states and fills each step's token bitmask for the guided requests that sample.

Owned by the engine's processor. Compiling happens where the processor validates a request:
on the servers' worker threads (``OpenAIServing.prepare``) or in ``add_request`` before the
request is queued; never inside a step. The backend (and its library) is loaded when the first
constrained request arrives, so engines that never see one pay nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from octavo.errors import InvalidRequestError
from octavo.structured_output.backend import (
    BackendUnavailableError,
    GrammarCompileError,
    StructuredOutputBackend,
    create_backend,
    resolve_backend_name,
)
from octavo.structured_output.bitmask import GrammarBitmask
from octavo.structured_output.grammar_cache import GrammarCache
from octavo.structured_output.params import StructuredOutputsParams
from octavo.structured_output.request_state import GrammarState


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...],
                 backend: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.default_backend = resolve_backend_name(backend)
        self.cache = GrammarCache()
        self._backends: dict[str, StructuredOutputBackend] = {}
        self._lock = threading.Lock()

    def backend(self, name: str | None = None) -> StructuredOutputBackend:
        name = self.default_backend if name is None else resolve_backend_name(name)
        backend = self._backends.get(name)
        if backend is None:
            with self._lock:  # the tokenizer scan takes a while: once, whichever thread
                backend = self._backends.get(name)
                if backend is None:
                    backend = create_backend(name, self.tokenizer, self.vocab_size,
                                             self.stop_token_ids)
                    self._backends[name] = backend
        return backend

    # ------------------------------------------------------------------ requests
    def compile(self, params: StructuredOutputsParams) -> tuple[StructuredOutputBackend, Any]:
        """(backend, compiled grammar) for a request; InvalidRequestError naming the field
        when the constraint does not compile or no backend can serve it."""
        prefix = params._field_prefix
        try:
            backend = self.backend(params.backend)
        except ValueError as e:
            raise InvalidRequestError(f"{prefix}.backend", str(e)) from None
        except BackendUnavailableError as e:
            raise InvalidRequestError(prefix, str(e)) from None
        field = f"{prefix}.{params.kind}"
        try:
            compiled = self.cache.get_or_compile(
                (backend.name, *params.cache_key()), lambda: backend.compile(params))
        except GrammarCompileError as e:
            raise InvalidRequestError(field, f"{field}: {e}") from None
        return backend, compiled

    def new_state(self, params: StructuredOutputsParams) -> GrammarState:
        backend, compiled = self.compile(params)  # a cache hit: the processor compiled it
        return GrammarState(backend, backend.new_matcher(compiled))

    # ------------------------------------------------------------------ the step
    def step_bitmask(self, grammars: Mapping[str, GrammarState]) -> GrammarBitmask | None:
        """The bitmask of the guided requests that sample this step, one row each in the
        order given (the batch's: the worker then needs no reordering), or None. Each
        matcher has seen every token before the one sampled now; a grammar that has ended
        constrains nothing (its request goes on only with ignore_eos)."""
        live = {rid: st for rid, st in grammars.items() if not st.is_terminated}
        if not live:
            return None
        ids = list(live)
        states = list(live.values())
        by_backend: dict[int, list[int]] = {}
        for i, st in enumerate(states):
            by_backend.setdefault(id(st.backend), []).append(i)
        if len(by_backend) == 1:
            bitmask = states[0].backend.allocate_bitmask(len(ids))
            states[0].backend.fill_bitmask([st.matcher for st in states], bitmask)
            return GrammarBitmask(ids, bitmask)
        # Several backends in one step (a request chose its own): rows grouped per backend.
        order = [i for rows in by_backend.values() for i in rows]
        ids = [ids[i] for i in order]
        states = [states[i] for i in order]
        bitmask = states[0].backend.allocate_bitmask(len(ids))
        start = 0
        for rows in by_backend.values():
            group = states[start: start + len(rows)]
            group[0].backend.fill_bitmask([st.matcher for st in group],
                                          bitmask[start: start + len(rows)])
            start += len(rows)
        return GrammarBitmask(ids, bitmask)
