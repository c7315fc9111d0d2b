"""Compiled grammars by constraint: a JSON schema sent with every request of a pipeline is
compiled once. Failures are remembered too, so a malformed schema sent again is refused at
once instead of recompiled. Thread-safe: servers compile on worker threads while the engine
thread reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from octavo.structured_output.backend import GrammarCompileError

DEFAULT_CAPACITY = 128  # compiled grammars hold token-mask caches (KBs to MBs each)


class GrammarCache:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compile(self, key: Hashable, compile_fn: Callable[[], Any]) -> Any:
        """The grammar compiled for ``key`` (compiling it on a miss, outside the lock: two
        threads may then both compile a new key, which is harmless); a cached failure is
        raised again."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
        if entry is None:
            self.misses += 1
            try:
                entry = compile_fn()
            except GrammarCompileError as e:
                entry = e
            with self._lock:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
        if isinstance(entry, GrammarCompileError):
            raise GrammarCompileError(str(entry))
        return entry
