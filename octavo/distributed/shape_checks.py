"""Whether a model can be split over ``tensor_parallel_size`` ranks: checked before anything
starts, so that a shape that does not divide is an error naming it, never a floor that fails
inside a kernel at the first forward pass."""

from __future__ import annotations

from typing import Any


def check_tensor_parallel(hf_config: Any, tp: int, device_type: str) -> None:
    """``tp``: a size ParallelConfig has already accepted (an integer >= 1)."""
    if tp == 1:
        return
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} does not divide the model's "
                         f"{heads} attention heads (num_attention_heads)")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} and the model's {kv_heads} KV heads "
                         "(num_key_value_heads): one must divide the other (fewer KV heads "
                         "than ranks are replicated)")
    inter = getattr(hf_config, "intermediate_size", None)
    if inter is not None and inter % tp:
        raise ValueError(f"tensor_parallel_size={tp} does not divide the model's "
                         f"intermediate_size {inter}")
    if device_type == "cuda":
        import torch

        count = torch.cuda.device_count()
        if tp > count:
            raise ValueError(f"tensor_parallel_size={tp} needs {tp} GPUs; this machine has "
                             f"{count}")
