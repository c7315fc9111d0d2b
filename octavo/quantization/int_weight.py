"""What the integer weight-only formats (GPTQ, AWQ) share once their own packing is undone:
integer weights [in, out], integer zeros and float scales per group, maybe an act-order
group index, turned at load into what runs.

- On CUDA (with Triton, 4 or 8 bits): a fused kernel's packed layout, chosen per layer by
  ``octavo.kernels.int_weight_layout`` (the GEMV's along K, the swap-AB GEMM's for the
  large 4-bit projections on Hopper, rows for per-channel 8-bit ones), act-order rows sorted so
  that groups are contiguous, the activations permuted through a stored index at each call.
  On the rows layout one- and two-row batches also fuse the MLP's activation and the qkv
  projection's rotary into the GEMV's store (``apply_gated``, ``apply_qkv_rope``).
- Elsewhere: the float weight [out, in], dequantized once with the group index, which the layer
  may pack for oneDNN (``dense_weight``). Correct, not small: the CPU issue makes it lean.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.kernels import int_weight_layout
from octavo.kernels import w4a16_gemm as kern
from octavo.kernels.triton_utils import HAS_TRITON
from octavo.quantization.base import LinearMethod

logger = logging.getLogger(__name__)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int,
                 order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Values of ``packed`` (int32, ``32 // bits`` per entry along ``dim``) as int32, the
    unpacked dim ``pack`` times longer. Value ``i`` of an entry sits at bits ``i * bits``;
    ``order[i]`` says which of the entry's ``pack`` features it is (natural order if None)."""
    pack = 32 // bits
    moved = packed.movedim(dim, -1)
    shifts = torch.arange(pack, device=packed.device, dtype=torch.int32) * bits
    vals = (moved.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., entries, pack]
    if order is not None:
        # vals[..., i] is feature order[i] of its entry: place it there.
        inverse = torch.empty(pack, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(pack)
        vals = vals[..., inverse.to(packed.device)]
    return vals.flatten(-2).movedim(-1, dim)


def check_divisible(prefix: str, what: str, value: int, by: int, why: str) -> None:
    if value % by:
        raise ValueError(f"layer {prefix!r}: {what} = {value} is not divisible by {why} "
                         f"({by}); this quantization cannot hold the layer")


def use_kernel(device: torch.device, k: int, group_size: int, bits: int) -> bool:
    return (device.type == "cuda" and HAS_TRITON
            and kern.kernel_supports(k, group_size, bits))


class IntWeightLinearMethod(LinearMethod):
    """Base of the GPTQ and AWQ methods: subclasses create the checkpoint's parameters and
    implement ``unpack(layer)``; this class turns the result into what ``apply`` runs."""

    # The rows layout's GEMV has a rotating store; each layer's instance says at load
    # whether its layout is that one.
    has_qkv_rope = True


    def __init__(self, bits: int, group_size: int) -> None:
        self.bits = bits
        self.group_size = group_size  # -1: one group over all input features

    def unpack(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor | None]:
        """(q int [in, out], zeros int [groups, out], scales float [groups, out], group index
        int [in] or None when row k is in group k // group_size)."""
        raise NotImplementedError

    def checkpoint_params(self) -> tuple[str, ...]:
        """The parameters ``create_weights`` registered, dropped once repacked."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, zeros, scales, g_idx = self.unpack(layer)
        k = q.shape[0]
        group = self.group_size if self.group_size != -1 else k
        if g_idx is not None:
            g_idx = g_idx.to(torch.long)
            if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= scales.shape[0]):
                raise ValueError(f"layer {layer.prefix!r}: g_idx holds groups outside "
                                 f"0..{scales.shape[0] - 1}")
        for name in self.checkpoint_params():
            delattr(layer, name)
        layer.kernel_group = None
        self.has_qkv_rope = False
        if use_kernel(q.device, k, group, self.bits):
            # A layer may ask for a layout (a mixture-of-experts layer's experts: along K,
            # which its grouped kernel stacks); else the size and bits rule.
            layer.kernel_layout = (getattr(layer, "int_layout", None)
                                   or int_weight_layout.choose(k, q.shape[1], group, self.bits,
                                                               q.device))
            # Only the rows layout's GEMV has a rotating store (``apply_qkv_rope``).
            self.has_qkv_rope = int_weight_layout.has_qkv_rope(layer.kernel_layout, k,
                                                               q.shape[1], group)
            layer.glu_block = self._glu_block(layer, k, q.shape[1], group)
            qk, zk, sk = q, zeros, scales
            if layer.glu_block:
                # gate and up in turn (the CUDA kernel's gated store: apply_gated).
                cols = int_weight_layout.glu_blocked(q.shape[1], layer.glu_block, q.device)
                qk, zk, sk = q[:, cols], zeros[:, cols], scales[:, cols]
            kernel = self._kernel_layout(qk, zk, sk, g_idx, group, layer.kernel_layout)
            if kernel is not None:
                for name, t in zip(("qweight_kernel", "scales_kernel", "zeros_kernel",
                                    "act_perm"), kernel):
                    layer.register_buffer(name, t, persistent=False)
                layer.kernel_group = group
                # One zero point for every group (symmetric checkpoints): the rows GEMV
                # takes it as a number and reads no zeros.
                z = layer.zeros_kernel
                layer.kernel_zero = (float(z.reshape(-1)[0]) if z.numel()
                                     and bool((z == z.reshape(-1)[0]).all()) else None)
                return
            layer.glu_block = None
            logger.warning("layer %r: act-order groups are not contiguous blocks of %d rows "
                           "after sorting; it runs on a dequantized float weight", layer.prefix,
                           group)
        if g_idx is None:
            g_idx = torch.arange(k, device=q.device) // group
        w = (q.to(torch.float32) - zeros.to(torch.float32)[g_idx]) * \
            scales.to(torch.float32)[g_idx]
        layer.register_buffer("dequantized_weight", w.t().contiguous().to(self.params_dtype),
                              persistent=False)

    def _glu_block(self, layer: nn.Module, k: int, n: int, group: int) -> int | None:
        """The block of ``glu_blocked`` columns this layer's weight takes: an MLP's
        [gate | up] without bias, in the swap-AB layout, whose gated store the CUDA kernel
        has (``OCTAVO_SWAPAB_GLU``); else None."""
        sizes = getattr(layer, "output_partition_sizes", ())
        if not (envs.swapab_glu() and envs.fused_glu() and len(sizes) == 2
                and sizes[0] == sizes[1] and getattr(layer, "bias", None) is None
                and getattr(layer, "int_layout", None) is None
                and layer.kernel_layout == int_weight_layout.SWAPAB):
            return None
        return int_weight_layout.glu_block(k, n, group, self.bits)

    def _kernel_layout(self, q, zeros, scales, g_idx, group, layout):
        """(qweight, scales, zeros, act permutation or None) in the packed ``layout``, or None
        when act-order groups cannot be made contiguous."""
        perm = None
        if g_idx is not None:
            trivial = torch.arange(q.shape[0], device=q.device) // group
            if not torch.equal(g_idx, trivial):
                # Sort rows by group once; the activations follow through ``perm`` per call.
                perm = torch.argsort(g_idx, stable=True)
                q, g_idx = q[perm], g_idx[perm]
                if torch.equal(perm, torch.arange(len(perm), device=perm.device)):
                    perm = None  # already in order (a tensor-parallel shard's global groups)
                blocks = g_idx.view(-1, group)
                if not bool((blocks == blocks[:, :1]).all()):
                    return None
            # A tensor-parallel shard's g_idx names global groups: keep its groups only.
            rows = g_idx[::group]
            zeros, scales = zeros[rows], scales[rows]
        # Zeros become floats (exact integers): the kernel subtracts them in float32.
        return (int_weight_layout.pack(q, self.bits, layout), scales.contiguous(),
                zeros.to(scales.dtype).contiguous(), perm)

    def apply(self, layer, x, bias):
        if layer.kernel_group is None:
            w = layer.dequantized_weight
            return F.linear(x, w if w.dtype == x.dtype else w.to(x.dtype), bias)
        if layer.act_perm is not None:
            x = x.index_select(-1, layer.act_perm)
        y = int_weight_layout.linear(x, layer.qweight_kernel, layer.scales_kernel,
                                     layer.zeros_kernel, layer.kernel_group, self.bits,
                                     layer.kernel_layout, layer.kernel_zero)
        if getattr(layer, "glu_block", None):  # back to [gate | up] (apply_gated is the path)
            y = int_weight_layout.glu_unblocked(y, layer.glu_block)
        return y if bias is None else y + bias

    def apply_gated(self, layer, x, bias):
        if getattr(layer, "glu_block", None) and x.is_cuda:
            if layer.act_perm is not None:
                x = x.index_select(-1, layer.act_perm)
            return int_weight_layout.gated_blocked(
                x, layer.qweight_kernel, layer.scales_kernel, layer.zeros_kernel,
                layer.kernel_group, self.bits, layer.glu_block)
        sizes = layer.output_partition_sizes
        if not (layer.kernel_group is not None and x.is_cuda and bias is None
                and len(sizes) == 2 and sizes[0] == sizes[1] and envs.fused_glu()):
            return None
        return int_weight_layout.gated(x, layer.qweight_kernel, layer.scales_kernel,
                                       layer.zeros_kernel, layer.kernel_group,
                                       layer.kernel_layout, layer.kernel_zero, layer.act_perm)

    def apply_qkv_rope(self, layer, x, bias, positions, cos_sin_cache, kv_store):
        if not (layer.kernel_group is not None and x.is_cuda and bias is None
                and envs.fused_qkv_rope() and hasattr(layer, "num_kv_heads")):
            return None
        return int_weight_layout.qkv_rope(
            x, layer.qweight_kernel, layer.scales_kernel, layer.zeros_kernel,
            layer.kernel_group, layer.kernel_layout, layer.kernel_zero, layer.act_perm,
            positions, cos_sin_cache, layer.num_heads, layer.num_kv_heads, layer.head_dim,
            kv_store)

    def dense_weight(self, layer):
        return getattr(layer, "dequantized_weight", None)
