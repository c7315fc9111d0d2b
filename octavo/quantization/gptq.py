"""GPTQ checkpoints as AutoGPTQ and GPTQModel write them.

Per linear layer (``in`` input features, ``out`` output features, ``pack = 32 // bits``):

- ``qweight`` int32 [in / pack, out]: packed along the input, input row ``i`` of column ``o`` in
  ``qweight[i // pack, o]`` at bits ``(i % pack) * bits``.
- ``qzeros`` int32 [groups, out / pack]: packed along the output the same way. With
  ``checkpoint_format`` "gptq" (v1, AutoGPTQ) each zero is stored minus one, so the reader adds
  one after unpacking; "gptq_v2" (GPTQModel) stores zeros as they are.
- ``scales`` float16 [groups, out]; ``g_idx`` int32 [in]: the group of each input row (a
  permutation of the trivial ``i // group_size`` when ``desc_act``, "act-order", is on).
- ``W[o, i] = (q[i, o] - zero[g_idx[i], o]) * scales[g_idx[i], o]``.

Act-order is handled at load, never per weight access: on the GPU the input rows are sorted by
group once (the activations follow through a stored permutation); on the CPU the weight is
dequantized once with ``g_idx`` (see ``int_weight``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from octavo.quantization.base import QuantizationConfig, ignored_modules
from octavo.quantization.int_weight import IntWeightLinearMethod, check_divisible, unpack_int32
from octavo.quantization.module_match import checkpoint_modules
from octavo.quantization.param_layout import set_param_layout

GPTQ_BITS = (4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def scales_dtype(params_dtype: torch.dtype) -> torch.dtype:
    """Checkpoints store float16 scales: keep them so, exact, unless the model runs in float32
    (which holds float16 exactly)."""
    return torch.float32 if params_dtype == torch.float32 else torch.float16


def _shared_g_idx_loader(layer: nn.Module):
    """Merged parts (q/k/v, gate/up) each bring a g_idx; GPTQ orders them by the same inputs,
    so they agree, and one layer can hold only one: a second part must repeat the first."""
    loaded_parts: list = []

    def load(param, loaded, shard_id=None):
        before = param.data.clone() if loaded_parts else None
        layer.weight_loader(param, loaded, shard_id)
        if before is not None and not torch.equal(before, param.data):
            raise ValueError(f"layer {layer.prefix!r}: merged part {shard_id!r} has a g_idx "
                             f"(act order) different from part {loaded_parts[0]!r}'s; one layer "
                             "holds one order")
        loaded_parts.append(shard_id)
    return load


class GPTQLinearMethod(IntWeightLinearMethod):
    def __init__(self, bits: int, group_size: int, desc_act: bool,
                 zeros_minus_one: bool) -> None:
        super().__init__(bits, group_size)
        self.desc_act = desc_act
        self.zeros_minus_one = zeros_minus_one

    def checkpoint_params(self):
        return ("qweight", "qzeros", "scales", "g_idx")

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        prefix = layer.prefix
        k, n = input_size_per_partition, sum(output_partition_sizes)
        pack = 32 // self.bits
        check_divisible(prefix, "input features", k, pack, f"the {self.bits}-bit pack factor")
        for size in output_partition_sizes:
            check_divisible(prefix, "output features", size, pack,
                            f"the {self.bits}-bit pack factor of qzeros")
        full_in = layer.input_size
        if self.group_size == -1:
            groups, split_groups = 1, False
        else:
            check_divisible(prefix, "input features", k, self.group_size, "group_size")
            # Act-order scatters a row-parallel shard's rows over all groups: every rank
            # keeps every group's scales and zeros, and g_idx (narrowed) says which.
            split_groups = not (self.desc_act and k != full_in)
            groups = (k if split_groups else full_in) // self.group_size
        in_dim = 0 if split_groups else None

        def param(shape, dtype, **layout):
            p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            return set_param_layout(p, **layout)

        layer.register_parameter("qweight", param(
            (k // pack, n), torch.int32, input_dim=0, output_dim=1, packed_dim=0,
            pack_factor=pack))
        layer.register_parameter("qzeros", param(
            (groups, n // pack), torch.int32, input_dim=in_dim, output_dim=1, packed_dim=1,
            pack_factor=pack))
        layer.register_parameter("scales", param(
            (groups, n), scales_dtype(params_dtype), input_dim=in_dim, output_dim=1))
        g_idx = param((k,), torch.int32, input_dim=0)
        g_idx.weight_loader = _shared_g_idx_loader(layer)
        layer.register_parameter("g_idx", g_idx)

    def unpack(self, layer):
        q = unpack_int32(layer.qweight.data, self.bits, dim=0)
        zeros = unpack_int32(layer.qzeros.data, self.bits, dim=1)
        if self.zeros_minus_one:
            zeros = zeros + 1  # may reach 2**bits: kept as a wider integer, not re-masked
        g_idx = layer.g_idx.data if self.desc_act else None
        return q, zeros, layer.scales.data, g_idx


class GPTQConfig(QuantizationConfig):
    """``quantization_config`` (or quantize_config.json): bits, group_size, desc_act, sym,
    checkpoint_format, lm_head, modules_to_not_convert, and GPTQModel's ``dynamic`` per-module
    rules ({"-:regex": {}} leaves matching modules unquantized, {"regex": {"bits": 8}}
    overrides settings)."""

    name = "gptq"

    def __init__(self, bits: int = 4, group_size: int = 128, desc_act: bool = False,
                 sym: bool = True, checkpoint_format: str = "gptq", lm_head: bool = False,
                 ignore=(), dynamic: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__(ignore)
        self.bits, self.group_size, self.desc_act, self.sym = bits, group_size, desc_act, sym
        self.checkpoint_format = checkpoint_format
        self.quantize_lm_head = lm_head
        self.dynamic = dict(dynamic or {})
        self._check(bits, group_size, checkpoint_format, "")

    @staticmethod
    def _check(bits, group_size, checkpoint_format, where: str) -> None:
        if bits not in GPTQ_BITS:
            raise ValueError(f"GPTQ{where} bits={bits} is not supported (supported: "
                             f"{list(GPTQ_BITS)})")
        if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
            raise ValueError(f"GPTQ{where} group_size={group_size!r} must be -1 or positive")
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint_format={checkpoint_format!r} is not supported "
                             f"(supported: {list(CHECKPOINT_FORMATS)})")

    @classmethod
    def from_config(cls, config):
        if not config:
            raise ValueError("quantization='gptq' needs a GPTQ checkpoint (bits and group_size "
                             "in config.json's quantization_config or quantize_config.json); "
                             "this checkpoint declares none")
        if config.get("is_marlin_format"):
            raise ValueError("GPTQ checkpoints in Marlin's packed format are not supported")
        return cls(bits=int(config.get("bits", 4)), group_size=int(config.get("group_size", 128)),
                   desc_act=bool(config.get("desc_act", False)),
                   sym=bool(config.get("sym", True)),
                   checkpoint_format=str(config.get("checkpoint_format") or "gptq").lower(),
                   lm_head=bool(config.get("lm_head", False)), ignore=ignored_modules(config),
                   dynamic=config.get("dynamic"))

    def _dynamic_rule(self, module: str) -> Mapping[str, Any] | None:
        """GPTQModel's rule for ``module``: None (no rule), {"skip": True}, or overrides."""
        for key, overrides in self.dynamic.items():
            negative = key.startswith("-:")
            pattern = key[2:] if key.startswith(("-:", "+:")) else key
            if re.match(pattern, module):
                return {"skip": True} if negative else dict(overrides or {})
        return None

    def get_linear_method(self, layer, prefix):
        settings = {"bits": self.bits, "group_size": self.group_size,
                    "desc_act": self.desc_act}
        if self.dynamic:
            parts = checkpoint_modules(prefix, self.packed_modules_mapping)
            rules = [self._dynamic_rule(p) for p in parts]
            if any(r != rules[0] for r in rules):
                raise ValueError(f"layer {prefix!r} merges {parts}, which GPTQ's dynamic rules "
                                 f"treat differently ({rules}); a merged layer needs one setting")
            if rules[0] is not None:
                if rules[0].get("skip"):
                    return None
                settings.update({k: v for k, v in rules[0].items() if k in settings})
                self._check(settings["bits"], settings["group_size"], self.checkpoint_format,
                            f" (dynamic rule for {prefix!r})")
        return GPTQLinearMethod(settings["bits"], settings["group_size"],
                                bool(settings["desc_act"]),
                                zeros_minus_one=self.checkpoint_format == "gptq")
