"""Where a parameter's input and output features lie, and how they are packed.

A quantization method creates parameters of many shapes (AWQ's qweight is [in, out/8], GPTQ's
is [in/8, out], group scales are [in/group, out]). Each carries its layout as attributes so the
linear layers' one weight loader can narrow any of them for tensor parallelism and place
merged shards (q/k/v, gate/up) without knowing the method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParamLayout:
    input_dim: int | None = None  # dim indexing input features (None: not split by input)
    output_dim: int | None = None  # dim indexing output features (None: not split by output)
    packed_dim: int | None = None  # dim whose entries each hold pack_factor values
    pack_factor: int = 1

    def stored(self, dim: int, features: int, what: str = "features") -> int:
        """``features`` along ``dim`` in stored entries (packed dims hold pack_factor each)."""
        if dim != self.packed_dim or self.pack_factor == 1:
            return features
        if features % self.pack_factor:
            raise ValueError(f"{features} {what} along dim {dim} are not divisible by the "
                             f"pack factor {self.pack_factor}")
        return features // self.pack_factor


def set_param_layout(param: torch.Tensor, *, input_dim: int | None = None,
                     output_dim: int | None = None, packed_dim: int | None = None,
                     pack_factor: int = 1) -> torch.Tensor:
    """Attach a layout to ``param`` (returned, for chaining)."""
    if packed_dim is not None and packed_dim not in (input_dim, output_dim):
        raise ValueError(f"packed_dim={packed_dim} must be the input_dim ({input_dim}) or "
                         f"the output_dim ({output_dim})")
    if pack_factor < 1:
        raise ValueError(f"pack_factor must be >= 1, got {pack_factor}")
    param.input_dim = input_dim
    param.output_dim = output_dim
    param.packed_dim = packed_dim
    param.pack_factor = pack_factor
    return param


def param_layout(param: torch.Tensor) -> ParamLayout:
    """The layout attached by ``set_param_layout`` (all None for a plain parameter)."""
    return ParamLayout(getattr(param, "input_dim", None), getattr(param, "output_dim", None),
                       getattr(param, "packed_dim", None), getattr(param, "pack_factor", 1))


# The parts of a stacked experts parameter: [E, 2I, H] holds gate ("w1") and up ("w3") rows,
# [E, H, I] the down projection ("w2").
_EXPERT_PARTS = {"w13_weight": ("w1", "w3"), "w2_weight": ("w2",)}


def set_expert_shards(param: torch.Tensor, name: str, num_experts: int) -> torch.Tensor:
    """Mark ``param`` (``w13_weight`` or ``w2_weight`` of a mixture-of-experts layer) with the
    shard ids ``(expert, part)`` the generic loader must have seen for it to be complete."""
    param.expected_shards = [(e, w) for e in range(num_experts) for w in _EXPERT_PARTS[name]]
    return param


def expert_shard(shard_id, num_experts: int) -> tuple[int, str]:
    """``shard_id`` checked as an expert's part: (expert in [0, num_experts), part)."""
    if not (isinstance(shard_id, tuple) and len(shard_id) == 2):
        raise ValueError(f"an expert tensor needs a shard id (expert, 'w1' | 'w3' | 'w2'), "
                         f"got {shard_id!r}")
    expert, which = shard_id
    if not 0 <= expert < num_experts:
        raise ValueError(f"expert {expert} out of range (the model has {num_experts})")
    return expert, which
