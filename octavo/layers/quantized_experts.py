"""A mixture-of-experts layer's experts as one quantized SwiGLU MLP each (GPTQ, AWQ,
compressed-tensors, FP8, bitsandbytes: whatever the checkpoint's or the user's scheme is).

Quantized experts keep the tools' own per-expert layout (``experts.3.gate_proj.qweight`` ...), so
each expert is built from the ordinary linear layers: a merged gate/up column-parallel linear
and a row-parallel down linear, each asking the quantization config for its method at its own
prefix (``model.layers.0.mlp.experts.3.gate_up_proj``). Every scheme's packed layout, tensor
parallel narrowing, ignore and dynamic rules, and weight loader then apply unchanged, on every
device the scheme runs on; the checkpoint's names reach them through the model's
``packed_modules_mapping`` (gate_proj / up_proj -> gate_up_proj) like a dense MLP's.

The down projection does not all-reduce: ``FusedMoE`` sums the routed experts' partial outputs
and all-reduces once.

Weight-only integer experts (GPTQ, AWQ, compressed-tensors W4A16 / W8A16, bitsandbytes int8)
on the kernel path are packed along K (``int_layout``) and, once loaded, stacked (``finish_loading``) into the
``IntExperts`` that ``octavo.kernels.fused_moe_int`` runs in two grouped launches, whose
decode steps are captured in CUDA graphs. Each expert's linear layers keep views into the
stacked tensors, so the weights are held once. Every other scheme, and experts that do not
stack (mixed bits, groups or layouts), run in ``FusedMoE``'s loop, which reads per-expert
counts on the host: not for CUDA graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.kernels.fused_moe import Fp8Experts
from octavo.kernels.fused_moe_int import IntExperts
from octavo.kernels.int_weight_layout import ALONG_K
from octavo.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from octavo.quantization.base import QuantizationConfig

_KERNEL_BUFFERS = ("qweight_kernel", "scales_kernel", "zeros_kernel")


class FloatExperts(NamedTuple):
    """Experts whose layers are exactly ``x W^T``, stacked for ``octavo.kernels.fused_moe``."""

    w13: torch.Tensor  # [E, 2I, H]
    w2: torch.Tensor  # [E, H, I]


class _Expert(nn.Module):
    """One expert: down(silu(gate x) * up x), without the down projection's all-reduce."""

    def __init__(self, hidden: int, intermediate: int, quant_config: QuantizationConfig,
                 prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2,
                                                       quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj", reduce_results=False)
        for layer in (self.gate_up_proj, self.down_proj):
            layer.int_layout = ALONG_K  # integer schemes: the layout the grouped kernel stacks
            layer.keeps_fp8 = keeps_fp8  # FP8 schemes: kept as they are for the grouped kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The methods' fused activations where they have them (as LlamaMLP), else plain.
        h = self.gate_up_proj.forward_gated(x)
        if h is not None:
            return self.down_proj(h)
        gate_up = self.gate_up_proj(x)
        y = self.down_proj.forward_glu(gate_up)
        if y is not None:
            return y
        inter = gate_up.shape[-1] // 2
        return self.down_proj(F.silu(gate_up[..., :inter]) * gate_up[..., inter:])


class QuantizedExperts(nn.ModuleList):
    """``num_experts`` experts, expert ``e`` at ``<prefix>.<e>`` (the checkpoint's
    ``experts.<e>``); ``intermediate`` is the full (unsharded) expert width."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int,
                 quant_config: QuantizationConfig, prefix: str) -> None:
        super().__init__(_Expert(hidden, intermediate, quant_config, f"{prefix}.{e}")
                         for e in range(num_experts))
        self.num_experts = num_experts
        self.stacked: IntExperts | Fp8Experts | FloatExperts | None = None

    def finish_loading(self) -> None:
        """Stack the experts for a grouped kernel: integer experts on the kernel path, FP8
        experts kept in FP8 (``keeps_fp8``), or experts whose layers are exactly ``x W^T`` with a float weight (block-scaled FP8 and
        FP8 W8A16 dequantized at load, GPTQ experts left unquantized by ``dynamic`` rules),
        on the kernels' device. Each expert's layers then hold views into the stacked
        tensors."""
        self.stacked = (stack_int_experts(self) or stack_fp8_experts(self)
                        or stack_float_experts(self))

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on rows ``x``: this rank's partial down(silu(gate x) * up x)."""
        return self[e](x)


def _kernel_spec(layer: nn.Module) -> tuple[int, int] | None:
    """(bits, group) of a layer holding an along-K integer weight for the kernel
    (``qweight_kernel`` / ``scales_kernel`` / ``zeros_kernel``): GPTQ / AWQ /
    compressed-tensors on the kernel path, or bitsandbytes int8 (one group per row, zero
    point 128); None for anything else."""
    if getattr(layer, "bias", None) is not None:
        return None
    if getattr(layer, "bnb_kind", None) == "int8_kernel":
        return 8, layer.qweight_kernel.shape[0] * 4
    bits = getattr(getattr(layer, "quant_method", None), "bits", None)
    group = getattr(layer, "kernel_group", None)
    if bits not in (4, 8) or group is None or getattr(layer, "kernel_layout", None) != ALONG_K:
        return None
    return bits, group


def _stackable(layers: list[nn.Module]) -> tuple[int, int] | None:
    """(bits, group) shared by ``layers`` where each holds an along-K integer weight for the
    kernel (:func:`_kernel_spec`) of one shape and one scales dtype; else None."""
    first = layers[0]
    spec = _kernel_spec(first)
    if spec is None:
        return None
    for layer in layers:
        if (_kernel_spec(layer) != spec
                or layer.scales_kernel.dtype != first.scales_kernel.dtype
                or layer.qweight_kernel.shape != first.qweight_kernel.shape):
            return None
    return spec


def _stack_views(layers: list[nn.Module], name: str) -> torch.Tensor:
    """The layers' ``name`` tensors stacked, each layer's attribute replaced by its view into
    the stack (the weights are held once)."""
    whole = torch.stack([getattr(layer, name) for layer in layers])
    for e, layer in enumerate(layers):
        setattr(layer, name, whole[e])
    return whole


def _perms(layers: list[nn.Module], width: int) -> torch.Tensor | None:
    """The layers' act-order input permutations as int32 [E, width] (identity for a layer
    without one), or None where no layer has one."""
    perms = [getattr(layer, "act_perm", None) for layer in layers]
    if all(p is None for p in perms):
        return None
    device = layers[0].qweight_kernel.device
    ident = torch.arange(width, device=device)
    return torch.stack([ident if p is None else p for p in perms]).to(torch.int32)


def stack_int_experts(experts: QuantizedExperts) -> IntExperts | None:
    """``experts`` as one ``IntExperts`` (their layers' kernel buffers replaced by views into
    it), or None where they are not all integer experts of one shape on the kernel path."""
    gate_up = [ex.gate_up_proj for ex in experts]
    down = [ex.down_proj for ex in experts]
    a, b = _stackable(gate_up), _stackable(down)
    if a is None or b is None or a[0] != b[0]:
        return None
    if gate_up[0].scales_kernel.dtype != down[0].scales_kernel.dtype:
        return None
    stacked = {}
    for tag, layers in (("13", gate_up), ("2", down)):
        for name, short in zip(_KERNEL_BUFFERS, ("w", "s", "z"), strict=True):
            stacked[short + tag] = _stack_views(layers, name)
    hidden = gate_up[0].qweight_kernel.shape[0] * (32 // a[0])
    inter = down[0].qweight_kernel.shape[0] * (32 // a[0])
    return IntExperts(group13=a[1], group2=b[1], bits=a[0], perm13=_perms(gate_up, hidden),
                      perm2=_perms(down, inter), **stacked)


def _dense_holder(layer: nn.Module) -> str | None:
    """The attribute holding ``layer``'s float [out, in] weight where its method's ``apply``
    is exactly ``x W^T`` (``dense_weight``) and it has no bias; else None."""
    if getattr(layer, "bias", None) is not None:
        return None
    dense = layer.quant_method.dense_weight(layer)
    if dense is None:
        return None
    for name in ("dequantized_weight", "weight"):
        if getattr(layer, name, None) is dense:
            return name
    return None


def stack_float_experts(experts: QuantizedExperts) -> FloatExperts | None:
    """``experts`` as stacked float weights (their layers' weights replaced by views into
    them), or None where any layer is not a plain float ``x W^T`` of the common shape and
    dtype, or the weights are not where the grouped kernel runs."""
    from octavo.layers import fused_moe  # the kernels' device rule (patched by tests)

    stacked = []
    for layers in ([ex.gate_up_proj for ex in experts], [ex.down_proj for ex in experts]):
        names = [_dense_holder(layer) for layer in layers]
        if any(n is None for n in names):
            return None
        weights = [getattr(layer, n) for layer, n in zip(layers, names, strict=True)]
        if len({(tuple(w.shape), w.dtype) for w in weights}) != 1 or \
                not fused_moe.on_kernel_device(weights[0]):
            return None
        stacked.append((layers, names, weights))
    out = []
    for layers, names, weights in stacked:
        whole = torch.stack([w.detach() for w in weights])
        for e, (layer, name) in enumerate(zip(layers, names, strict=True)):
            view = whole[e]
            if isinstance(getattr(layer, name), nn.Parameter):
                view = nn.Parameter(view, requires_grad=False)
            setattr(layer, name, view)
            layer._packed_weight = None  # a CPU copy of the old weight (none on CUDA)
        out.append(whole)
    return FloatExperts(*out)


def keeps_fp8(weight: torch.Tensor) -> bool:
    """At load, for an expert's FP8 layer: keep its FP8 weight and scales (per row or per
    block) as they are, for ``fused_moe``'s FP8 path: the grouped kernels on (``OCTAVO_FUSED_MOE``),
    ``weight`` where they run (CUDA of compute capability 8.9 and above, whose Triton
    converts e4m3). Elsewhere the layer dequantizes as any FP8 layer does."""
    from octavo.layers import fused_moe  # the kernels' device rule (patched by tests)

    if not (envs.fused_moe() and fused_moe.on_kernel_device(weight)):
        return False
    return not weight.is_cuda or torch.cuda.get_device_capability(weight.device) >= (8, 9)


def _fp8_spec(layer: nn.Module):
    """(shape, block or None) of a layer holding an FP8 weight with row or block scales for
    ``fused_moe`` (``weight_fp8`` with ``weight_scale`` or ``weight_block_scale``) and no
    bias; else None."""
    if getattr(layer, "bias", None) is not None or getattr(layer, "weight_fp8", None) is None:
        return None
    if getattr(layer, "weight_block_scale", None) is not None:
        return tuple(layer.weight_fp8.shape), layer.quant_method.block
    return tuple(layer.weight_fp8.shape), None


def stack_fp8_experts(experts: QuantizedExperts) -> Fp8Experts | None:
    """``experts`` as one ``Fp8Experts`` (their layers' FP8 weights and scales replaced by
    views into it), or None where they are not all FP8 layers of one shape and one scale
    kind on the kernels' device."""
    from octavo.layers import fused_moe  # the kernels' device rule (patched by tests)

    groups = ([ex.gate_up_proj for ex in experts], [ex.down_proj for ex in experts])
    specs = [{_fp8_spec(layer) for layer in layers} for layers in groups]
    if any(len(sp) != 1 or None in sp for sp in specs):
        return None
    blocks = {next(iter(sp))[1] for sp in specs}
    if len(blocks) != 1 or not fused_moe.on_kernel_device(groups[0][0].weight_fp8):
        return None
    block = blocks.pop()
    if block is not None and groups[1][0].weight_fp8.shape[1] % block[0]:
        return None  # the gate/up split is not on a block edge
    scale_name = "weight_scale" if block is None else "weight_block_scale"
    (w13, s13), (w2, s2) = ([_stack_views(layers, name) for name in ("weight_fp8", scale_name)]
                            for layers in groups)
    return Fp8Experts(w13=w13, s13=s13, w2=w2, s2=s2, block=block)
