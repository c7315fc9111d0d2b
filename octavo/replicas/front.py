"""The part of an engine the router keeps in the server's process: the config, tokenizer and
processor, with no model. The servers validate and tokenize requests through it (the
``.engine`` of an AsyncLLM plays this part) before anything reaches a replica, so a bad request
is a 400 at once and a replica only ever receives requests that its own processor accepts."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from octavo.config import EngineConfig
from octavo.engine.processor import Processor
from octavo.engine.tokenizer import load_tokenizer


class RouterFront:
    def __init__(self, config: EngineConfig, shutdown: Callable[[], None]) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model_config)
        self.processor = Processor(
            config.model_config, self.tokenizer, max_n=config.scheduler_config.sample_cap,
            structured_outputs_backend=config.structured_outputs_config.backend)
        self._ids = itertools.count()
        self._shutdown = shutdown

    def get_tokenizer(self):
        return self.tokenizer

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def shutdown(self) -> None:
        """Stop every replica (``LLM(data_parallel_size=N).llm_engine.shutdown()``)."""
        self._shutdown()
