"""One tensor-parallel rank's worker, as the executors that run ranks elsewhere see it.

The ``mp`` process loop (``worker_proc``) and the ``ray`` actor (``ray_executor``) differ only
in how messages reach a rank; what a rank does is here, once: pick its device, join the
tensor-parallel group, load its shard and report the KV blocks it could hold, allocate the
pool the executor settled on (the minimum over ranks), then run steps and resets.

Every rank samples identically (see ``MultiprocExecutor``), so only rank 0's results are
returned to the engine; the other ranks run each step to keep their state in step.
"""

from __future__ import annotations

import dataclasses
import traceback

from octavo.config import EngineConfig
from octavo.core.scheduler_output import SchedulerOutput
from octavo.worker.step_handle import StepHandle


def error_text(e: BaseException, with_traceback: bool = False) -> str:
    text = f"{type(e).__name__}: {e}"
    return text + "\n" + traceback.format_exc() if with_traceback else text


class WorkerRank:
    def __init__(self, config: EngineConfig, rank: int = 0, port: int = 0,
                 cuda_index: int | None = None) -> None:
        """``cuda_index``: the GPU this rank takes on CUDA when there are several ranks (the
        ``mp`` executor passes the rank; a Ray actor sees only its own GPU, index 0)."""
        self.config = config
        self.rank = rank
        self.port = port
        self.cuda_index = rank if cuda_index is None else cuda_index
        self.worker = None
        self._launch_error: str | None = None

    @property
    def replies(self) -> bool:
        """Whether this rank's step results go back to the engine."""
        return self.rank == 0

    def load_and_size(self) -> tuple[int, int]:
        """Join the group, load this rank's shard; the (device, CPU) KV blocks it can hold."""
        import torch

        from octavo.distributed.parallel_state import init_tensor_parallel
        from octavo.worker.worker import Worker, resolve_device

        config = self.config
        tp = config.parallel_config.tensor_parallel_size
        device = resolve_device(config.device_config.device)
        if device.type == "cuda" and tp > 1:
            # One GPU per rank: the engine resolved "auto" to its own device (NCCL refuses
            # two ranks on one device).
            torch.cuda.set_device(self.cuda_index)
            config = dataclasses.replace(config, device_config=dataclasses.replace(
                config.device_config, device=f"cuda:{self.cuda_index}"))
        init_tensor_parallel(self.rank, tp, self.port, device.type)
        self.worker = Worker(config)
        return self.worker.load_and_size()

    def init_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        self.worker.init_kv_cache(num_blocks, num_cpu_blocks)

    # A launched step, as both executors keep it until it is answered: its StepHandle, or
    # the error text of a launch that failed.
    def launch(self, sched: SchedulerOutput) -> StepHandle | str | None:
        """Launch a step; None for one launched with ``defer_sampling``, whose handle (or
        launch error) comes from ``sample``."""
        self._launch_error = None
        try:
            return self.worker.execute_model_async(sched)
        except Exception as e:
            if sched.defer_sampling:  # still answered once, at its sample
                self._launch_error = error_text(e)
                return None
            return error_text(e)

    def sample(self, grammar) -> StepHandle | str:
        """Sample the step launched with ``defer_sampling`` (its launch error, if any)."""
        failed, self._launch_error = self._launch_error, None
        if failed is not None:
            return failed
        try:
            return self.worker.sample_tokens(grammar)
        except Exception as e:
            return error_text(e)

    def answer(self, item: StepHandle | str) -> tuple[str, object] | None:
        """Wait for a launched step: ("out", ModelRunnerOutput) or ("error", text) on rank
        0; None on the other ranks, which only keep their state in step."""
        if isinstance(item, str):
            return ("error", item) if self.replies else None
        try:
            out = item.result()
        except Exception as e:
            return ("error", error_text(e)) if self.replies else None
        return ("out", out) if self.replies else None

    def reset(self) -> None:
        self.worker.reset()
