"""Engine configuration: frozen dataclasses, one per concern, validated once.

Torch-free on purpose: the scheduler imports it. Dtypes are strings here; the worker maps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float", "bf16", "fp16", "fp32")
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32",
                  "bf16": "bfloat16"}


def normalize_dtype(dtype: str) -> str:
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    return _DTYPE_ALIASES.get(dtype, dtype)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # folder, GGUF file, or the embedded default's path
    tokenizer: str | None
    hf_config: Any  # transformers.PretrainedConfig
    dtype: str  # resolved: float32 / float16 / bfloat16
    max_model_len: int
    architecture: str
    served_model_name: str
    eos_token_ids: tuple[int, ...]
    is_gguf: bool = False
    load_format: str = "auto"
    skip_tokenizer_init: bool = False
    seed: int = 0
    chat_template: str | None = None
    revision: str | None = None
    # The most logprobs (per position) a request may ask for, as vLLM's engine argument;
    # -1 lifts the cap (a full-vocabulary answer is then allowed).
    max_logprobs: int = 20


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes for the pool on CPU
    # GiB of CPU memory for the KV blocks of requests preempted by swap (vLLM's default);
    # reserved only when preemption_mode="swap".
    swap_space: float = 4.0
    enable_prefix_caching: bool = True
    # vLLM's kv_cache_dtype: "auto" (the model's dtype) or "fp8" / "fp8_e4m3" (float8 e4m3,
    # unscaled as vLLM's default scales of 1.0: half the bytes per block, CUDA only).
    cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, "
                             f"got {self.cache_dtype!r}")
        if self.block_size < 1 or self.block_size > 256:
            raise ValueError(f"block_size must be in [1, 256], got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(
                f"num_gpu_blocks_override must be >= 1, got {self.num_gpu_blocks_override}")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0, got {self.swap_space}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    # How a preempted request gives up its KV blocks: "recompute" (dropped, recomputed on
    # resume) or "swap" (copied to CPU swap space and back; recompute when it is full).
    preemption_mode: str = "recompute"
    # Schedule step N+1 while step N runs on the device (outputs lag one step). Resolved
    # by EngineArgs: on for CUDA unless set.
    async_scheduling: bool = False
    # The most samples (n, best_of) one request may ask for; None: max_num_seqs. Never
    # more than max_num_seqs: one request must not be able to hold the whole batch.
    max_n: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_n is not None and not 1 <= self.max_n <= self.max_num_seqs:
            raise ValueError(f"max_n must be in [1, max_num_seqs={self.max_num_seqs}], got "
                             f"{self.max_n}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}) when chunked prefill is disabled")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', "
                             f"got {self.preemption_mode!r}")

    @property
    def sample_cap(self) -> int:
        """The most samples one request may ask for (max_n, else max_num_seqs)."""
        return self.max_n if self.max_n is not None else self.max_num_seqs

    @property
    def group_share(self) -> int:
        """The most running sequences one request's samples hold while other requests wait
        (half the batch): a huge n or best_of cannot starve everyone else."""
        return max(1, self.max_num_seqs // 2)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    # The executor (octavo.executor.registry): "uni" (the worker in this process), "mp"
    # (one worker process per rank) or "ray" (one Ray actor per rank); None: "uni" for one
    # rank, "mp" for several.
    distributed_executor_backend: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got "
                             f"{self.tensor_parallel_size!r}")
        if self.tensor_parallel_size > 1 and self.distributed_executor_backend == "uni":
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} needs one "
                             "process per rank: distributed_executor_backend='mp' (the "
                             "default for several ranks), not 'uni'")
        if self.distributed_executor_backend is not None:
            from octavo.executor.registry import known_backends

            if self.distributed_executor_backend not in known_backends():
                raise ValueError(
                    f"distributed_executor_backend={self.distributed_executor_backend!r} is "
                    f"not supported (known: {known_backends()})")
        if self.distributed_executor_backend == "ray":
            from octavo.executor.ray_executor import import_ray

            import_ray()  # not installed: an error naming the extra, before anything starts

    @property
    def executor_backend(self) -> str:
        default = "uni" if self.tensor_parallel_size == 1 else "mp"
        return self.distributed_executor_backend or default


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "auto"  # auto / cpu / cuda
    enforce_eager: bool = False
    attention_backend: str | None = None  # None: chosen by device


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """vLLM's structured_outputs_config: the grammar backend constrained requests use
    ("auto" = xgrammar); checked against the registry when the engine starts."""

    backend: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"structured outputs backend must be a backend name, got "
                             f"{self.backend!r}")


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device_config: DeviceConfig
    quantization: str | None = None
    structured_outputs_config: StructuredOutputsConfig = StructuredOutputsConfig()
