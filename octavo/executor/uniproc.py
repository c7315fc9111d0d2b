"""Executor with the single worker in this process."""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.executor.base import Executor
from octavo.structured_output.bitmask import GrammarBitmask
from octavo.worker.step_handle import StepHandle
from octavo.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        # Tests and benchmarks may look at the model through ``worker``; the engine does not.
        self.worker = Worker(config)
        self.num_blocks, self.num_cpu_blocks = self.worker.setup()

    def reset(self) -> None:
        self.worker.reset()

    def execute_model_async(self, sched: SchedulerOutput) -> StepHandle | None:
        """The step's handle; None with ``sched.defer_sampling`` (see sample_tokens)."""
        return self.worker.execute_model_async(sched)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> StepHandle:
        """Sample the step launched with ``defer_sampling``, with the guided rows' token
        bitmask (a plain message, like SchedulerOutput)."""
        return self.worker.sample_tokens(grammar)
