"""Checkpoints written by llm-compressor (``quant_method: "compressed-tensors"``).

``quantization_config`` holds ``config_groups`` (each: ``targets``, ``weights``,
``input_activations``, ``format``; see ``compressed_tensors_scheme``), an ``ignore`` list
(module names, or ``re:`` regexes matched from the start of the name), a ``format`` for groups
that name none, and ``sparsity_config`` / ``kv_cache_scheme`` / ``transform_config``, which
Octavo does not run (an error naming them, rather than a wrong model).

A layer takes the scheme of the first group whose targets match it (its checkpoint module
names: q_proj, k_proj, v_proj for our qkv_proj, which must all agree); no match, or an ignored
module, keeps it in full precision. The integer schemes run through ``int_weight`` (the Triton
W4A16 / W8A16 kernel on the GPU), FP8 through ``fp8_linear``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.compressed_tensors_scheme import (
    LINEAR_CLASSES,
    Fp8Scheme,
    IntWeightScheme,
    Scheme,
    parse_scheme,
)
from octavo.quantization.module_match import checkpoint_modules


def matches_target(module: str, target: str) -> bool:
    """compressed-tensors' rule: ``re:`` regexes match from the start of the module name,
    class names ("Linear") match every linear layer, anything else is an exact module name."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target in LINEAR_CLASSES or target == module


def _check_unsupported(config: Mapping[str, Any]) -> None:
    sparsity = config.get("sparsity_config") or {}
    if sparsity and str(sparsity.get("format", "dense")).lower() != "dense":
        structure = sparsity.get("sparsity_structure")
        raise ValueError(f"compressed-tensors sparsity (format {sparsity.get('format')!r}, "
                         f"structure {structure!r}) is not supported")
    if config.get("kv_cache_scheme"):
        raise ValueError(f"compressed-tensors kv_cache_scheme {config['kv_cache_scheme']} (a "
                         "quantized KV cache) is not supported")
    if config.get("transform_config"):
        raise ValueError("compressed-tensors transform_config (rotations such as SpinQuant / "
                         "QuIP) is not supported")


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"
    # The targets and ignore list say exactly what the checkpoint holds: llm-compressor
    # lists the routers it leaves in float (it does so by itself), so a router it quantized
    # is one the config targets.
    quantizes_routers = True

    def __init__(self, groups: Mapping[str, tuple[tuple[str, ...], Scheme]],
                 ignore=()) -> None:
        super().__init__(ignore)
        self.groups = dict(groups)  # name -> (targets, scheme), in the checkpoint's order

    @classmethod
    def from_config(cls, config):
        if not config:
            raise ValueError("quantization='compressed-tensors' needs a checkpoint written by "
                             "llm-compressor (config_groups in config.json's "
                             "quantization_config); this checkpoint declares none")
        _check_unsupported(config)
        groups = {}
        for name, group in (config.get("config_groups") or {}).items():
            targets = tuple(group.get("targets") or ())
            if any(t in ("Embedding", "re:.*embed_tokens") for t in targets):
                raise ValueError(f"compressed-tensors config group {name!r} quantizes "
                                 "embeddings, which is not supported")
            groups[name] = (targets, parse_scheme(name, group, config.get("format")))
        if not groups:
            raise ValueError("compressed-tensors quantization_config has no config_groups")
        return cls(groups, config.get("ignore") or ())

    def _scheme_of(self, module: str) -> Scheme | None:
        """The scheme of the checkpoint module ``module``, None when unquantized."""
        if any(matches_target(module, pat) for pat in self.ignore):
            return None
        for targets, scheme in self.groups.values():
            if any(matches_target(module, t) for t in targets):
                return scheme
        return None

    def quantizes_experts(self, prefix):
        # Experts that no config group targets (a recipe quantizing attention only) stay
        # stacked in float; those it targets are held per expert.
        return any(self._scheme_of(f"{prefix}.0.{proj}") is not None
                   for proj in ("gate_proj", "up_proj", "down_proj"))

    def get_quant_method(self, layer, prefix):
        # Unlike the base class, the LM head is quantized when a group covers it and the
        # checkpoint does not ignore it (the layer then says it cannot hold that).
        parts = checkpoint_modules(prefix, self.packed_modules_mapping)
        schemes = [self._scheme_of(p) for p in parts]
        if any(s != schemes[0] for s in schemes):
            raise ValueError(f"layer {prefix!r} merges {parts}, which the checkpoint quantizes "
                             f"differently ({schemes}); a merged layer needs one scheme")
        return None if schemes[0] is None else self.method_for(schemes[0])

    @staticmethod
    def method_for(scheme: Scheme) -> LinearMethod:
        if isinstance(scheme, IntWeightScheme):
            from octavo.quantization.compressed_tensors_int import CompressedTensorsIntMethod

            return CompressedTensorsIntMethod(scheme)
        assert isinstance(scheme, Fp8Scheme), scheme
        if scheme.block is not None:  # the fp8 method's blocks, the scale named weight_scale
            from octavo.quantization import fp8

            return fp8.Fp8LinearMethod(False, True, scheme.block, False,
                                       block_scale_name="weight_scale",
                                       act_group=scheme.act_group)
        from octavo.quantization.fp8_linear import Fp8LinearMethod

        return Fp8LinearMethod(scheme.weight_strategy, scheme.activations)
