"""EngineArgs: every user-facing engine option with vLLM's names, turned into an EngineConfig
once, with validation that names the offending value."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass

from octavo.config import (
    CacheConfig,
    DeviceConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    StructuredOutputsConfig,
    normalize_dtype,
)

logger = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory: int | None = None
    swap_space: float = 4.0  # GiB of CPU swap space, used when preemption_mode="swap"
    kv_cache_dtype: str = "auto"  # "fp8" / "fp8_e4m3": float8 KV blocks (CUDA)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    quantization: str | None = None
    # GGUF files on the CPU keep their block formats (quantization="gguf") unless this is set
    # or a dtype is given: then every tensor is dequantized at load.
    gguf_dequantize: bool = False
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # "uni" / "mp" / "ray"; None: "uni"
    load_format: str = "auto"
    device: str = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    served_model_name: str | None = None
    revision: str | None = None
    attention_backend: str | None = None
    scheduling_policy: str = "fcfs"
    preemption_mode: str = "recompute"
    # None: on when the device is CUDA (the CPU gains nothing from overlapping with itself).
    async_scheduling: bool | None = None
    # Request limits (vLLM's max_logprobs; max_n caps n and best_of, default max_num_seqs).
    max_logprobs: int = 20
    max_n: int | None = None
    # Structured outputs: vLLM's config (a StructuredOutputsConfig or a dict such as
    # {"backend": "xgrammar"}) or its older flag; None: "auto" (xgrammar).
    structured_outputs_config: StructuredOutputsConfig | dict | None = None
    guided_decoding_backend: str | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def create_engine_config(self) -> EngineConfig:
        from octavo.worker.worker import resolve_device

        device = resolve_device(self.device)
        model_config = _model_config(self, device.type)
        if self.preemption_mode == "swap" and not self.swap_space:
            logger.warning("preemption_mode='swap' with swap_space=0: no CPU swap space, "
                           "preempted requests are recomputed")
        cache = CacheConfig(
            block_size=self.block_size,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory=self.kv_cache_memory,
            swap_space=self.swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
            cache_dtype=self.kv_cache_dtype,
        )
        max_batched = self.max_num_batched_tokens
        if max_batched is None:
            max_batched = 8192 if self.enable_chunked_prefill else max(
                8192, model_config.max_model_len)
        sched = SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=max_batched,
            max_model_len=model_config.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode,
            async_scheduling=(device.type == "cuda" if self.async_scheduling is None
                              else bool(self.async_scheduling)),
            max_n=self.max_n,
        )
        from octavo.quantization.gguf import default_quantization
        from octavo.quantization.resolve import resolve_quantization

        # The scheme asked for (GGUF on the CPU: "gguf" by default), checked against the one
        # the checkpoint declares (ValueErrors name both); None: full precision.
        requested = default_quantization(
            self.quantization, is_gguf=model_config.is_gguf, device_type=device.type,
            dtype=normalize_dtype(self.dtype), dequantize=self.gguf_dequantize,
            load_format=self.load_format)
        quantization = resolve_quantization(
            requested, model_config.hf_config,
            None if model_config.is_gguf else model_config.model)
        from octavo.distributed.shape_checks import check_tensor_parallel

        parallel = ParallelConfig(self.tensor_parallel_size, self.distributed_executor_backend)
        check_tensor_parallel(model_config.hf_config, self.tensor_parallel_size, device.type)
        if cache.cache_dtype != "auto" and (device.type != "cuda"
                                            or self.attention_backend == "torch"):
            raise ValueError(f"kv_cache_dtype={cache.cache_dtype!r} needs a CUDA device and the "
                             f"Triton attention backend (device {device.type!r}, "
                             f"attention_backend {self.attention_backend!r})")
        if self.tensor_parallel_size > 1 and quantization == "gguf":
            raise ValueError("quantization='gguf' keeps GGUF blocks whole and cannot be split "
                             "over tensor_parallel_size > 1 yet; pass dtype= to dequantize")
        return EngineConfig(
            model_config=model_config,
            cache_config=cache,
            scheduler_config=sched,
            parallel_config=parallel,
            device_config=DeviceConfig(device=str(device), enforce_eager=self.enforce_eager,
                                       attention_backend=self.attention_backend),
            quantization=quantization,
            structured_outputs_config=self._structured_outputs_config(),
        )

    def _structured_outputs_config(self) -> StructuredOutputsConfig:
        from octavo.structured_output.backend import resolve_backend_name

        cfg = self.structured_outputs_config
        if isinstance(cfg, dict):
            unknown = sorted(set(cfg) - {"backend"})
            if unknown:
                raise ValueError(f"structured_outputs_config has unknown keys {unknown}")
            cfg = StructuredOutputsConfig(**cfg)
        elif cfg is None:
            cfg = StructuredOutputsConfig(self.guided_decoding_backend or "auto")
        elif not isinstance(cfg, StructuredOutputsConfig):
            raise ValueError(f"structured_outputs_config must be a dict or "
                             f"StructuredOutputsConfig, got {cfg!r}")
        resolve_backend_name(cfg.backend)  # an unknown name fails at startup, by name
        return cfg


def _model_config(args: EngineArgs, device_type: str) -> ModelConfig:
    from octavo.default_model import DEFAULT_MODEL_NAME, default_model_path
    from octavo.models.registry import resolve_architecture

    path = args.model
    served = args.served_model_name
    if path is None:
        path = default_model_path()
        served = served or DEFAULT_MODEL_NAME
    if args.load_format not in ("auto", "dummy", "safetensors", "gguf"):
        raise ValueError(f"load_format must be auto, dummy, safetensors or gguf, "
                         f"got {args.load_format!r}")
    is_gguf = path.endswith(".gguf")
    if is_gguf and not os.path.isfile(path):
        raise ValueError(f"model={path!r}: GGUF file not found")
    if not is_gguf and not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"model={path!r} not found: expected a local folder with config.json or a .gguf "
            "file (Octavo does not download from a model hub)")
    chat_template = None
    if is_gguf:
        from octavo.model_loader.gguf_file import GGUFModelConfig, open_gguf

        ckpt = open_gguf(path)
        hf_config = GGUFModelConfig(**ckpt.hf_config)
        eos = list(ckpt.eos_token_ids)
        chat_template = ckpt.chat_template
    else:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)
        eos = _eos_from_folder(path, hf_config)
    arch = resolve_architecture(getattr(hf_config, "architectures", None))
    return ModelConfig(
        model=path,
        tokenizer=args.tokenizer,
        hf_config=hf_config,
        dtype=_resolve_dtype(args.dtype, hf_config, is_gguf, device_type),
        max_model_len=_resolve_max_len(args.max_model_len, hf_config),
        architecture=arch,
        served_model_name=served or path,
        eos_token_ids=tuple(eos),
        is_gguf=is_gguf,
        load_format=args.load_format,
        skip_tokenizer_init=args.skip_tokenizer_init,
        seed=args.seed,
        chat_template=chat_template,
        revision=args.revision,
        max_logprobs=_check_max_logprobs(args.max_logprobs),
    )


def _check_max_logprobs(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"max_logprobs must be -1 (no cap) or a non-negative integer, got "
                         f"{value!r}")
    return value


def _eos_from_folder(path: str, hf_config) -> list[int]:
    gen_path = os.path.join(path, "generation_config.json")
    eos = None
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            eos = json.load(f).get("eos_token_id")
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _resolve_dtype(dtype: str, hf_config, is_gguf: bool, device_type: str) -> str:
    dtype = normalize_dtype(dtype)
    if dtype != "auto":
        if device_type == "cpu" and dtype == "float16":
            logger.warning("float16 on CPU is slow in many torch paths; consider bfloat16")
        return dtype
    if is_gguf:
        return "float32" if device_type == "cpu" else "bfloat16"
    cfg = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    name = str(cfg).replace("torch.", "") if cfg is not None else "float32"
    if name not in ("float32", "float16", "bfloat16"):
        name = "float32"
    if name == "float16" and device_type == "cpu":
        name = "bfloat16"
    return name


def _resolve_max_len(requested: int | None, hf_config) -> int:
    from octavo.layers.rope_params import model_max_position

    derived = model_max_position(hf_config)  # max_position_embeddings, extended by RoPE scaling
    window = getattr(hf_config, "sliding_window", None)
    if window and getattr(hf_config, "use_sliding_window", True) and window < derived:
        # Without sliding-window attention, stay inside the window so outputs are exact.
        derived = window
    if requested is None:
        return derived
    if requested < 1:
        raise ValueError(f"max_model_len must be >= 1, got {requested}")
    if requested > derived:
        raise ValueError(
            f"max_model_len={requested} is larger than the model's limit {derived} "
            "(max_position_embeddings with RoPE scaling / sliding window)")
    return requested
