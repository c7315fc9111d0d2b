"""One compressed-tensors ``config_groups`` entry read into what Octavo runs, or a clear error.

A group says which modules it covers (``targets``: class names such as "Linear", module names,
or ``re:`` regexes matched from the start of the name) and how their weights (and maybe input
activations) are quantized, through QuantizationArgs: ``num_bits``, ``type`` ("int" or
"float"), ``strategy`` ("tensor", "channel", "group", "block", "token", ...), ``group_size``,
``symmetric``, ``dynamic``, ``actorder``. Its ``format`` (or the config's) says how the
checkpoint stores them:

- ``pack-quantized``: integer weights, ``weight_packed`` int32 [out, in * bits / 32].
- ``naive-quantized`` / ``int-quantized``: integer weights one per int8 (``weight`` [out, in]).
- ``float-quantized`` (or ``naive-quantized`` with float weights): ``weight`` float8_e4m3fn.

Held here: int 4/8-bit weight-only (group or channel, symmetric or not); FP8 weights (tensor or
channel) with no activation quantization, dynamic per-token or per-tensor activations, or a
static per-tensor ``input_scale``. Everything else is a ValueError naming the scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized")
FLOAT_FORMATS = ("float-quantized", "naive-quantized")
INT_BITS = (4, 8)
# Class names a group may target that mean "every linear layer".
LINEAR_CLASSES = ("Linear", "LinearBase")


@dataclass(frozen=True)
class IntWeightScheme:
    """W4A16 / W8A16: integer weights, activations in the model's dtype."""
    bits: int
    group_size: int  # -1: one group per output channel (strategy "channel")
    symmetric: bool
    packed: bool  # pack-quantized (int32 words) vs naive (one int8 per value)
    g_idx: bool  # actorder "group": a weight_g_idx tensor says each input's group


@dataclass(frozen=True)
class Fp8Scheme:
    """FP8 (e4m3) weights with a per-tensor or per-channel scale; activations quantized to FP8
    per token or per tensor (dynamic), with a stored ``input_scale`` (static), or not at all.
    Strategy "block" (llm-compressor's FP8_BLOCK): a scale per ``block`` = (rows, columns)
    of the weight, run weight-only whatever the activations say (dynamic per group of
    columns in the preset)."""
    weight_strategy: str  # "tensor" | "channel" | "block"
    activations: str | None  # None | "dynamic-token" | "dynamic-tensor" | "static-tensor"
    block: tuple[int, int] | None = None
    act_group: int | None = None  # block: dynamic activations per group of columns


Scheme = IntWeightScheme | Fp8Scheme


def _describe(name: str, group: Mapping[str, Any]) -> str:
    w, a = group.get("weights") or {}, group.get("input_activations") or {}
    desc = f"config group {name!r} (weights {w.get('type', 'int')} {w.get('num_bits')}-bit " \
           f"{w.get('strategy')}"
    if a:
        desc += f", input activations {a.get('type', 'int')} {a.get('num_bits')}-bit " \
                f"{a.get('strategy')}{' dynamic' if a.get('dynamic') else ''}"
    return desc + ")"


def parse_scheme(name: str, group: Mapping[str, Any], default_format: str | None) -> Scheme:
    """The scheme of config group ``name``; ValueError naming it when Octavo cannot run it."""
    what = _describe(name, group)
    weights = group.get("weights")
    fmt = group.get("format") or default_format
    if not weights:
        raise ValueError(f"compressed-tensors {what}: only weight quantization is supported, "
                         "this group quantizes no weights")
    if group.get("output_activations"):
        raise ValueError(f"compressed-tensors {what}: output activation quantization is not "
                         "supported")
    wtype = str(weights.get("type", "int")).lower()
    bits = int(weights.get("num_bits", 8))
    strategy = str(weights.get("strategy") or "tensor").lower()
    acts = group.get("input_activations")
    if wtype == "int":
        if acts:
            raise ValueError(f"compressed-tensors {what}: integer weights with quantized "
                             "activations (W8A8 / W4A8 int) are not supported; weight-only "
                             "W4A16 / W8A16 and FP8 are")
        if fmt not in INT_FORMATS:
            raise ValueError(f"compressed-tensors {what}: format {fmt!r} is not supported for "
                             f"integer weights (supported: {list(INT_FORMATS)})")
        if bits not in INT_BITS:
            raise ValueError(f"compressed-tensors {what}: {bits}-bit integer weights are not "
                             f"supported (supported: {list(INT_BITS)})")
        if strategy == "group":
            group_size = weights.get("group_size")
            if not isinstance(group_size, int) or group_size <= 0:
                raise ValueError(f"compressed-tensors {what}: group strategy needs a positive "
                                 f"group_size, got {group_size!r}")
        elif strategy == "channel":
            group_size = -1
        else:
            raise ValueError(f"compressed-tensors {what}: weight strategy {strategy!r} is not "
                             "supported for integer weights (supported: 'group', 'channel')")
        if weights.get("dynamic"):
            raise ValueError(f"compressed-tensors {what}: dynamic weight quantization is not "
                             "supported")
        actorder = weights.get("actorder")
        return IntWeightScheme(bits, group_size, bool(weights.get("symmetric", True)),
                               packed=fmt == "pack-quantized",
                               g_idx=str(actorder).lower() in ("group", "dynamic"))
    if wtype == "float":
        if bits != 8:
            raise ValueError(f"compressed-tensors {what}: {bits}-bit float weights (NVFP4, "
                             "MXFP4) are not supported; FP8 is")
        if fmt not in FLOAT_FORMATS:
            raise ValueError(f"compressed-tensors {what}: format {fmt!r} is not supported for "
                             f"FP8 weights (supported: {list(FLOAT_FORMATS)})")
        if strategy not in ("tensor", "channel", "block"):
            raise ValueError(f"compressed-tensors {what}: FP8 weight strategy {strategy!r} is "
                             "not supported (supported: 'tensor', 'channel', 'block')")
        if not weights.get("symmetric", True):
            raise ValueError(f"compressed-tensors {what}: asymmetric FP8 weights are not "
                             "supported")
        if strategy == "block":
            block = weights.get("block_structure")
            if not (isinstance(block, (list, tuple)) and len(block) == 2
                    and all(isinstance(b, int) and b > 0 for b in block)):
                raise ValueError(f"compressed-tensors {what}: block strategy needs "
                                 f"block_structure [rows, columns], got {block!r}")
            act_group = None
            if acts:
                if not acts.get("dynamic", False):
                    raise ValueError(f"compressed-tensors {what}: FP8 blocks with static "
                                     "activation scales are not supported")
                if str(acts.get("strategy")).lower() == "group":
                    act_group = acts.get("group_size")
                    if not isinstance(act_group, int) or act_group <= 0:
                        raise ValueError(f"compressed-tensors {what}: group activations need "
                                         f"a positive group_size, got {act_group!r}")
                elif str(acts.get("strategy")).lower() != "token":
                    raise ValueError(f"compressed-tensors {what}: FP8 blocks with "
                                     f"{acts.get('strategy')!r} activations are not supported "
                                     "(dynamic per group or per token)")
            return Fp8Scheme("block", None, (block[0], block[1]), act_group)
        return Fp8Scheme(strategy, _fp8_activations(what, acts))
    raise ValueError(f"compressed-tensors {what}: weight type {wtype!r} is not supported")


def _fp8_activations(what: str, acts: Mapping[str, Any] | None) -> str | None:
    if not acts:
        return None
    atype = str(acts.get("type", "int")).lower()
    bits = int(acts.get("num_bits", 8))
    strategy = str(acts.get("strategy") or "tensor").lower()
    if atype != "float" or bits != 8:
        raise ValueError(f"compressed-tensors {what}: FP8 weights need FP8 activations or "
                         "none")
    if not acts.get("symmetric", True):
        raise ValueError(f"compressed-tensors {what}: asymmetric activations are not supported")
    dynamic = acts.get("dynamic")
    if dynamic is True and strategy in ("token", "tensor"):
        return f"dynamic-{strategy}"
    if dynamic is False and strategy == "tensor":
        return "static-tensor"
    raise ValueError(f"compressed-tensors {what}: FP8 activations with strategy {strategy!r} "
                     f"and dynamic={dynamic!r} are not supported (supported: dynamic per "
                     "token or per tensor, static per tensor)")
