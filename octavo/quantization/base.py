"""The two interfaces of quantization: a method (how one linear layer stores and applies its
weight) and a config (one per quantization scheme, choosing a method for each layer).

This package never imports ``octavo.layers``: layers hold a method, not the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from octavo.quantization.module_match import is_ignored


class LinearMethod:
    """How a linear layer stores and applies its weight; one instance per layer."""

    # Whether ``apply_qkv_rope`` can ever take a call (a kernel with a rotating store), so a
    # caller builds its KV store only for methods that might use it.
    has_qkv_rope: ClassVar[bool] = False

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        """Register the layer's parameters, each with its layout (``set_param_layout``).
        ``output_partition_sizes``: this rank's output features of each merged part (q, k, v;
        gate, up), one entry for a plain layer. The layer attaches its ``weight_loader`` to
        every parameter that does not bring its own."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def apply_glu(self, layer: nn.Module, x: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor | None:
        """``apply`` on ``silu(x[..., :I]) * x[..., I:]`` (x = an MLP's [gate | up]) with the
        activation computed inside the method's own kernel, where it has one for this call;
        None where it has not (the caller runs the activation, then ``apply``)."""
        return None

    def apply_gated(self, layer: nn.Module, x: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor | None:
        """``silu(y[..., :I]) * y[..., I:]`` of ``y = apply(layer, x, bias)`` (the layer an
        MLP's merged [gate | up]) computed inside the method's own kernel, where it has one
        for this call; None where it has not (the caller runs ``apply``, then the
        activation)."""
        return None

    def apply_qkv_rope(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                       kv_store) -> torch.Tensor | None:
        """For a qkv projection (``layer`` a QKVParallelLinear): q [..., Hq * D] of ``y =
        apply(layer, x, bias)`` = [q | k | v] with the NeoX rotary embedding of ``positions``
        (``cos_sin_cache``: cos then sin, the whole head) applied, the rotated k and the v
        written into the paged cache (``kv_store``: octavo.attention.backend.KVStore, its
        ``v`` unused), all inside the method's own kernel where it has one for this call;
        None, with nothing done, where it has not (the caller runs ``apply``, then the
        rotary)."""
        return None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack or convert what the checkpoint gave (once, after every tensor is loaded)."""

    def dense_weight(self, layer: nn.Module) -> torch.Tensor | None:
        """The float [out, in] weight when ``apply`` is exactly ``x W^T + b``, else None; the
        layer may keep a device-specific copy of it (oneDNN packing on the CPU)."""
        return None


def ignored_modules(config: Mapping[str, Any]) -> list[str]:
    """The modules a checkpoint leaves unquantized, under either usual key."""
    out: list[str] = []
    for key in ("modules_to_not_convert", "ignore"):
        out.extend(config.get(key) or [])
    return out


def is_lm_head(prefix: str) -> bool:
    return prefix == "lm_head" or prefix.endswith(".lm_head")


class QuantizationConfig:
    """One quantization scheme's settings, read from the checkpoint or given as
    ``quantization=``; subclasses live one per file and are registered by ``name``.

    ``get_quant_method(layer, prefix)`` chooses per layer, so a scheme can leave the LM head and
    ignored modules in full precision, or give each tensor its own type (GGUF: a config holding
    prefix -> tensor type, returning a method per type).
    """

    name: ClassVar[str] = ""
    # quant_method values of checkpoints this config can read; empty: just ``name``.
    checkpoint_methods: ClassVar[tuple[str, ...]] = ()
    # The LM head keeps full precision unless a scheme's checkpoint says otherwise.
    quantize_lm_head: bool = False
    # Whether a mixture of experts' routers (``mlp.gate``, ``shared_expert_gate``) are
    # chosen a method like any layer; else they stay in full precision, as GPTQModel and
    # AutoAWQ leave them. Set by schemes whose checkpoints say exactly what they quantized
    # (compressed-tensors' targets and ignore list; a bitsandbytes checkpoint's names).
    quantizes_routers: bool = False

    def __init__(self, ignore: Iterable[str] = ()) -> None:
        self.ignore = tuple(ignore)
        # The model's {checkpoint fragment: (our fragment, shard id)}, set before the model is
        # built so that ignore lists naming q_proj apply to our qkv_proj.
        self.packed_modules_mapping: Mapping = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> QuantizationConfig:
        """Build from a checkpoint's quantization config (``{}`` when the user asked for this
        scheme on a checkpoint that declares none)."""
        return cls(ignore=ignored_modules(config))

    @classmethod
    def reads_checkpoint(cls, quant_method: str) -> bool:
        return quant_method in (cls.checkpoint_methods or (cls.name,))

    def checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's (name, tensor) pairs as this scheme's parameters are named: a
        scheme whose format names tensors no parameter can carry (bitsandbytes'
        ``weight.absmax``) renames or drops them here, at the loader, not in the models."""
        return iter(weights)

    def bind_checkpoint_names(self, names: Iterable[str] | None) -> None:
        """The checkpoint's tensor names, given before the model is built (None where they
        are not known: dummy weights, GGUF), for a scheme whose config does not say all that
        its checkpoint quantized."""

    def quantizes_experts(self, prefix: str) -> bool:
        """Whether the mixture-of-experts experts at ``prefix``
        ("model.layers.0.mlp.experts") are quantized by this scheme (each expert's
        projections then choose their method like any linear layer); else they stay
        stacked in full precision."""
        return not is_ignored(prefix, self.ignore, {})

    def get_quant_method(self, layer: nn.Module, prefix: str) -> LinearMethod | None:
        """The method for the layer at ``prefix`` ("model.layers.0.self_attn.qkv_proj"), or
        None to keep it in full precision."""
        if is_lm_head(prefix) and not self.quantize_lm_head:
            return None
        if is_ignored(prefix, self.ignore, self.packed_modules_mapping):
            return None
        return self.get_linear_method(layer, prefix)

    def get_linear_method(self, layer: nn.Module, prefix: str) -> LinearMethod | None:
        """The scheme's method for a layer it quantizes."""
        raise NotImplementedError
