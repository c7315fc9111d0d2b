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
