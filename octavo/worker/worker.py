"""One device: picks it, loads the model, sizes and allocates the KV cache, runs steps."""

from __future__ import annotations

import logging

import torch

from octavo import envs
from octavo.config import EngineConfig
from octavo.core.kv_cache_manager import cdiv
from octavo.core.scheduler_output import SchedulerOutput
from octavo.structured_output.bitmask import GrammarBitmask
from octavo.worker.cpu_tuning import keep_heap_pages
from octavo.worker.model_runner import ModelRunner
from octavo.worker.step_handle import StepHandle
from octavo.worker.step_profiler import StepProfiler
from octavo.worker.swap_cache import SwapCache, num_swap_blocks

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} requested but CUDA is not available")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Worker:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device_config.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif envs.cpu_keep_heap():
            keep_heap_pages()
        torch.manual_seed(config.model_config.seed)
        self.runner = ModelRunner(config, self.device)
        from octavo.distributed.parallel_state import get_tp_group

        self.profiler = StepProfiler(get_tp_group().rank, self.device)

    def load_model(self) -> None:
        self.runner.load_model()

    def setup(self) -> tuple[int, int]:
        """Load the model, size and allocate the KV cache (device and swap space), capture
        CUDA graphs; returns (device blocks, CPU swap blocks)."""
        num_blocks, num_cpu_blocks = self.load_and_size()
        self.init_kv_cache(num_blocks, num_cpu_blocks)
        return num_blocks, num_cpu_blocks

    def load_and_size(self) -> tuple[int, int]:
        """Load the model; the KV blocks (device, CPU swap) this rank could hold. With
        several ranks the executor takes the minimum over them before ``init_kv_cache``."""
        self.load_model()
        return self.determine_num_blocks(), self.determine_num_cpu_blocks()

    def determine_num_blocks(self) -> int:
        cc, sc = self.config.cache_config, self.config.scheduler_config
        per_block = self.runner.bytes_per_block()
        # More blocks than every running sequence at full length can never be used.
        useful = sc.max_num_seqs * cdiv(sc.max_model_len, cc.block_size) + 1
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        if self.device.type == "cuda":
            peak = self.runner.profile_peak_memory()
            total = torch.cuda.get_device_properties(self.device).total_memory
            free_for_kv = int(total * cc.gpu_memory_utilization) - peak
            # Memory outside PyTorch's allocator (CUDA context, other processes) counts too.
            free_now, _ = torch.cuda.mem_get_info(self.device)
            non_torch = total - free_now - torch.cuda.memory_reserved(self.device)
            free_for_kv -= max(0, non_torch)
            if free_for_kv <= per_block:
                raise ValueError(
                    f"no memory left for the KV cache: gpu_memory_utilization="
                    f"{cc.gpu_memory_utilization} of {total / 2**30:.1f} GiB, model peak "
                    f"{peak / 2**30:.2f} GiB")
            return min(free_for_kv // per_block, useful)
        budget = cc.kv_cache_memory or DEFAULT_CPU_KV_CACHE_BYTES
        n = min(budget // per_block, useful)
        if n < 1:
            raise ValueError(f"kv_cache_memory={budget} bytes holds no {per_block}-byte block")
        return n

    def determine_num_cpu_blocks(self) -> int:
        """Blocks of CPU swap space: swap_space GiB over the bytes of one block (every
        layer); 0, no swap space, unless preemption_mode is "swap"."""
        if self.config.scheduler_config.preemption_mode != "swap":
            return 0
        return num_swap_blocks(self.config.cache_config.swap_space,
                               self.runner.bytes_per_block())

    def init_kv_cache(self, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.runner.init_kv_cache(num_blocks)
        self.runner.swap_cache = (SwapCache(self.runner.kv_caches, num_cpu_blocks)
                                  if num_cpu_blocks else None)
        self.runner.capture_cuda_graphs()
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB)", num_blocks,
                    self.config.cache_config.block_size,
                    num_blocks * self.runner.bytes_per_block() / 2**30)
        if num_cpu_blocks:
            logger.info("CPU swap space: %d blocks (%.2f GiB)", num_cpu_blocks,
                        num_cpu_blocks * self.runner.bytes_per_block() / 2**30)

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a sticky device error surfaces here
        self.runner.reset()

    def execute_model_async(self, sched: SchedulerOutput) -> StepHandle | None:
        self.profiler.before_step()
        return self.runner.execute_model_async(sched)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> StepHandle:
        return self.runner.sample_tokens(grammar)
