"""Executor with the single worker in this process."""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.executor.base import Executor
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

    def execute_model_async(self, sched: SchedulerOutput) -> StepHandle:
        return self.worker.execute_model_async(sched)
