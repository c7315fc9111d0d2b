"""The decoder stack of a Llama-style model in one C++ call for CPU decode steps.

At batch 1 a 30-layer model is ~360 small kernel calls a step, each behind a module call,
a dispatch and tensor views: about 60 us of Python a layer, a fifth of the step on the 2-core
machine. When every linear layer of every decoder layer is GGUF-quantized (one rank, no biases but
Qwen2's on q/k/v; Qwen3's q/k norms and mixture-of-experts MLPs whose experts are GGUF too
included), a
decode-only step runs ``gguf_decoder_layers`` (kernels/cpu/decoder.cpp) instead: the same
kernels in the same order, so the tokens are the same bit for bit at batch 1 (an MoE step of
several tokens runs each token's experts on its own there, where the Python loop groups the
tokens by expert: the same kernels, rows summed in another order).
``OCTAVO_CPU_FUSED_DECODE=0`` turns it off.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo import envs
from octavo.attention.layer import ForwardContext


class FusedGGUFDecode:
    """Built by :func:`build` for a model that qualifies; call it on decode-only steps."""

    def __init__(self, ops, layers: nn.ModuleList) -> None:
        from octavo.quantization.gguf import ISA_CODES, dense_min_rows

        self.ops = ops
        first = layers[0].self_attn
        self.num_heads, self.num_kv_heads = first.num_heads, first.num_kv_heads
        self.head_dim = first.head_dim
        self.scale = first.attn.impl.scale
        self.eps = layers[0].input_layernorm.eps
        self.cos_sin_cache = first.rotary_emb.cos_sin_cache
        self.isa = ISA_CODES[envs.cpu_quant_isa()]
        self.params: list[torch.Tensor] = []
        self.in_features: list[int] = []
        self.segments: list[int] = []  # per linear layer, in in_features' order
        # Per layer: bit 0 q/k norms (Qwen3), bit 1 a mixture of experts, bit 2 a qkv bias
        # (Qwen2) (decoder.cpp).
        self.layer_kinds: list[int] = []
        self.moe_shape: list[int] = []
        linears = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.params.append(layer.input_layernorm.weight)
            kind = 0
            for lin in (attn.qkv_proj, attn.o_proj):
                self._add_linear(lin)
                if lin.bias is not None:  # the qkv projection's (build checked)
                    self.params.append(lin.bias)
                    kind |= 4
            self.in_features += [attn.qkv_proj.quant_method.in_features,
                                 attn.o_proj.quant_method.in_features]
            if attn.q_norm is not None:
                self.params += [attn.q_norm.weight, attn.k_norm.weight]
                kind |= 1
            self.params.append(layer.post_attention_layernorm.weight)
            if hasattr(mlp, "gate_up_proj"):
                for lin in (mlp.gate_up_proj, mlp.down_proj):
                    self._add_linear(lin)
                    self.in_features.append(lin.quant_method.in_features)
                linears += [mlp.gate_up_proj, mlp.down_proj]
            else:  # FusedMoE with GGUF experts
                kind |= 2
                self.moe_shape = [mlp.num_experts, mlp.top_k, int(mlp.renormalize),
                                  mlp.experts.inter]
                self.params.append(mlp.gate.weight)
                for e in range(mlp.num_experts):
                    self.params += [*mlp.experts._w13[e], *mlp.experts._w2[e]]
            linears += [attn.qkv_proj, attn.o_proj]
            self.layer_kinds.append(kind)
        # The kernel picks one path per step for every layer: the integer one at every row
        # count only when every weight is interleaved.
        self.dense_min_rows = min(dense_min_rows(seg[0], self.isa) for lin in linears
                                  for seg in lin.quant_method.segments(lin))
        # The same tensors, converted to C++ once (ops.h: TensorList).
        self.param_list = ops.TensorList(self.params)

    def _add_linear(self, lin) -> None:
        segments = lin.quant_method.segments(lin)
        for segment in segments:
            self.params += segment
        self.segments.append(len(segments))

    def applies(self, x: torch.Tensor, ctx: ForwardContext) -> bool:
        meta = ctx.attn_metadata
        return (meta.max_query_len == 1 and meta.num_tokens == meta.num_reqs == x.shape[0]
                and x.dtype == self.params[0].dtype == ctx.kv_caches[0].dtype
                and x.is_contiguous())

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) after the last decoder layer, before the final norm."""
        meta = ctx.attn_metadata
        n = meta.num_tokens
        x, residual = self.ops.gguf_decoder_layers(
            x, positions, self.param_list, self.in_features, self.segments, ctx.kv_caches,
            meta.slot_mapping[:n], meta.block_tables[:n], meta.seq_lens[:n],
            self.cos_sin_cache, self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
            self.eps, self.isa, self.dense_min_rows, self.layer_kinds, self.moe_shape)
        return x, residual


def _gguf_linears(*linears, bias_dtype: torch.dtype | None = None) -> bool:
    """Every one GGUF-quantized, on one rank, without a bias (or, given ``bias_dtype``, with
    none or one of that dtype)."""
    from octavo.quantization.gguf import GGUFLinearMethod

    return all(isinstance(lin.quant_method, GGUFLinearMethod) and lin.tp.size == 1
               and (lin.bias is None or lin.bias.dtype == bias_dtype) for lin in linears)


def _mlp_qualifies(mlp, x: torch.Tensor) -> bool:
    from octavo.layers.fused_moe import FusedMoE
    from octavo.quantization.gguf_experts import GGUFExperts

    if isinstance(mlp, FusedMoE):  # GGUF experts, no shared expert, one rank
        return (isinstance(mlp.experts, GGUFExperts) and mlp.shared_expert is None
                and mlp.tp.size == 1 and mlp.gate.weight.dtype == x.dtype)
    return hasattr(mlp, "gate_up_proj") and _gguf_linears(mlp.gate_up_proj, mlp.down_proj)


def build(layers: nn.ModuleList, x: torch.Tensor) -> FusedGGUFDecode | None:
    """The fused path for these decoder layers, or None when any part does not qualify."""
    from octavo.attention.torch_backend import TorchAttentionImpl
    from octavo.kernels import cpu as cpu_kernels
    from octavo.layers.rotary import RotaryEmbedding

    if not envs.cpu_fused_decode() or x.device.type != "cpu" or len(layers) == 0:
        return None
    ops = cpu_kernels.ops_for(x)
    if ops is None or not hasattr(ops, "gguf_decoder_layers"):
        return None
    eps = getattr(getattr(layers[0], "input_layernorm", None), "eps", None)
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or not _mlp_qualifies(mlp, x):
            return None
        if attn.q_norm is not None and not (
                attn.q_norm.eps == attn.k_norm.eps == eps
                and attn.q_norm.weight.dtype == x.dtype):
            return None
        if type(getattr(attn, "rotary_emb", None)) is not RotaryEmbedding or \
                attn.rotary_emb.cos_sin_cache.dtype != torch.float32:
            return None
        if not isinstance(attn.attn.impl, TorchAttentionImpl):
            return None
        if not (_gguf_linears(attn.qkv_proj, bias_dtype=x.dtype) and _gguf_linears(attn.o_proj)):
            return None
    return FusedGGUFDecode(ops, layers)
