"""Executor with the single worker in this process."""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.worker.step_handle import StepHandle
from octavo.worker.worker import Worker


class UniProcExecutor:
    def __init__(self, config: EngineConfig) -> None:
        self.worker = Worker(config)
        self.worker.load_model()
        self.num_blocks = self.worker.determine_num_blocks()
        self.num_cpu_blocks = self.worker.determine_num_cpu_blocks()  # swap space
        self.worker.init_kv_cache(self.num_blocks, self.num_cpu_blocks)

    def reset(self) -> None:
        """Drop every request's worker state (the engine restarts after a fault)."""
        self.worker.reset()

    def execute_model_async(self, sched: SchedulerOutput) -> StepHandle:
        return self.worker.execute_model_async(sched)
