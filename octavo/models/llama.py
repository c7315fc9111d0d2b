"""The Llama family (Llama 2/3, Mistral without sliding window, SmolLM2), and the decoder that
Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm, explicit head_dim) reuse."""

from __future__ import annotations

import torch
from torch import nn

from octavo import envs
from octavo.attention.layer import Attention, ForwardContext
from octavo.layers.activation import SiluAndMul
from octavo.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from octavo.layers.norm import RMSNorm
from octavo.layers.rope_params import rope_params_from_config
from octavo.layers.rotary import get_rope
from octavo.layers.vocab_embedding import LMHead, VocabEmbedding
from octavo.layers.weight_prefetch import WeightPrefetch
from octavo.models import cpu_fused_decode
from octavo.models.cpu_fused_decode import FusedGGUFDecode
from octavo.quantization.base import QuantizationConfig


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int,
                 quant_config: QuantizationConfig | None = None, prefix: str = "") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2,
                                                       quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate, hidden, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj")
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up_proj.forward_gated(x)  # the activation in the gate/up GEMV's store
        if h is not None:
            return self.down_proj(h)
        gate_up = self.gate_up_proj(x)
        y = self.down_proj.forward_glu(gate_up)  # the activation inside the down GEMV
        return y if y is not None else self.down_proj(self.act(gate_up))


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_idx: int, backend, qkv_bias: bool = False,
                 qk_norm: bool = False, quant_config: QuantizationConfig | None = None,
                 rope_cache: dict | None = None, prefix: str = "") -> None:
        super().__init__()
        rope_cache = {} if rope_cache is None else rope_cache
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv = getattr(config, "num_key_value_heads", None) or total_heads
        head_dim = getattr(config, "head_dim", None) or hidden // total_heads
        qkv_bias = qkv_bias or bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, total_heads, total_kv,
                                          bias=qkv_bias, quant_config=quant_config,
                                          prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        o_bias = bool(getattr(config, "attention_bias", False))
        self.o_proj = RowParallelLinear(total_heads * head_dim, hidden, bias=o_bias,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        theta, scaling = rope_params_from_config(config)
        self.rotary_emb = get_rope(head_dim, config.max_position_embeddings, theta, scaling,
                                   rope_cache)
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.attn = Attention(layer_idx, self.num_heads, head_dim, head_dim ** -0.5,
                              self.num_kv_heads, backend)
        # The weights read after attention, pulled into L2 behind it (set by LlamaModel).
        self.prefetch: WeightPrefetch | None = None

    def _fused_qk_norm_rope(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """On CUDA, Qwen3's q/k norms and the rotation in one in-place launch."""
        if not (q.is_cuda and envs.fused_qk_norm_rope()):
            return False
        from octavo.kernels.qk_norm_rope import supports
        from octavo.kernels.triton_utils import HAS_TRITON

        return HAS_TRITON and supports(q, k, self.rotary_emb.cos_sin_cache, self.head_dim)

    def _fused_qkv_rope(self, positions: torch.Tensor, x: torch.Tensor,
                        ctx: ForwardContext) -> torch.Tensor | None:
        """Under OCTAVO_FUSED_QKV_ROPE (on by default), on CUDA, without q/k
        norms: q [T, Hq * D] from a qkv projection whose own kernel also applied the rotary
        embedding and wrote the rotated k and the v into the paged cache
        (``QKVParallelLinear.forward_rope``: the FP8 GEMV's store at one-row fp8 decodes),
        so no rotary launch runs; None, with nothing done, where it cannot."""
        if not (x.is_cuda and self.q_norm is None and self.qkv_proj.quant_method.has_qkv_rope
                and envs.fused_qkv_rope() and envs.fused_kv_store()
                and getattr(self.rotary_emb, "is_neox", False)):
            return None
        store = self.attn.kv_store(None, ctx, num_tokens=x.shape[0])
        if store is None:
            return None
        return self.qkv_proj.forward_rope(x, positions, self.rotary_emb.cos_sin_cache, store)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        t = x.shape[0]
        q = self._fused_qkv_rope(positions, x, ctx)
        if q is not None:  # rotated, k and v already in the cache
            o = self.attn(q.view(t, self.num_heads, self.head_dim), None, None, ctx,
                          kv_stored=True)
        else:
            o = self._attention(positions, x, ctx)
        if self.prefetch is not None:
            self.prefetch(t, o.device)
        return self.o_proj(o.reshape(t, self.q_size))

    def _attention(self, positions: torch.Tensor, x: torch.Tensor,
                   ctx: ForwardContext) -> torch.Tensor:
        """The projection, the rotary (and Qwen3's q/k norms), attention: the unfused path."""
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = x.shape[0]
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        # On CUDA the launch that rotates q and k also writes the new K/V into the paged cache.
        store = self.attn.kv_store(v, ctx) if q.is_cuda and envs.fused_kv_store() else None
        if self.q_norm is not None and self._fused_qk_norm_rope(q, k):
            from octavo.kernels.qk_norm_rope import qk_norm_rope

            qk_norm_rope(positions, q, k, self.q_norm.weight, self.k_norm.weight,
                         self.q_norm.eps, self.rotary_emb.cos_sin_cache, kv_store=store)
        else:
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if store is None or not self.rotary_emb.rotate_and_store(positions, q, k, store):
                store = None
                q, k = self.rotary_emb(positions, q, k)
        return self.attn(q, k, v, ctx, kv_stored=store is not None)


def dense_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
              prefix: str) -> nn.Module:
    return LlamaMLP(config.hidden_size, config.intermediate_size, quant_config, prefix=prefix)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, backend, qkv_bias: bool = False,
                 qk_norm: bool = False, quant_config: QuantizationConfig | None = None,
                 rope_cache: dict | None = None, prefix: str = "", make_mlp=dense_mlp) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, backend, qkv_bias, qk_norm,
                                        quant_config, rope_cache, prefix=f"{prefix}.self_attn")
        # make_mlp(config, layer_idx, quant_config, prefix): the dense SwiGLU MLP, or a
        # mixture of experts (qwen3_moe, mixtral)
        self.mlp = make_mlp(config, layer_idx, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, x, residual, ctx):
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config, backend, qkv_bias: bool = False, qk_norm: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "model",
                 make_mlp=dense_mlp) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        rope_cache: dict = {}
        self.layers = nn.ModuleList([
            LlamaDecoderLayer(config, i, backend, qkv_bias, qk_norm, quant_config, rope_cache,
                              prefix=f"{prefix}.layers.{i}", make_mlp=make_mlp)
            for i in range(config.num_hidden_layers)
        ])
        for i, layer in enumerate(self.layers):
            # A mixture of experts reads only its routed experts: nothing worth prefetching.
            mlp = ([layer.mlp.gate_up_proj, layer.mlp.down_proj]
                   if hasattr(layer.mlp, "gate_up_proj") else [])
            parts = {"o": [layer.self_attn.o_proj], "mlp": mlp}
            if i + 1 < len(self.layers):
                parts["qkv"] = [self.layers[i + 1].self_attn.qkv_proj]
            layer.self_attn.prefetch = WeightPrefetch(parts)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self._fused: FusedGGUFDecode | None | bool = False  # False: not built yet

    def forward(self, input_ids, positions, ctx):
        x = self.embed_tokens(input_ids)
        if self._fused is False:  # built on the first step, after the weights are final
            self._fused = cpu_fused_decode.build(self.layers, x)
        if self._fused is not None and self._fused.applies(x, ctx):
            x, residual = self._fused(x, positions, ctx)
        else:
            residual = None
            for layer in self.layers:
                x, residual = layer(positions, x, residual, ctx)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (our parameter fragment, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    qkv_bias = False
    qk_norm = False
    # Whether a decode step of this model may be captured in a CUDA graph.
    cuda_graph_safe = True

    def __init__(self, config, backend, quant_config: QuantizationConfig | None = None
                 ) -> None:
        super().__init__()
        self.config = config
        self.check_config(config)
        self.model = LlamaModel(config, backend, self.qkv_bias, self.qk_norm, quant_config,
                                prefix="model", make_mlp=self.make_mlp)
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, quant_config, "lm_head")
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.tie(self.model.embed_tokens)
        # Whether the loader skips the checkpoint's lm_head.*: a quantized head is not tied.
        self.tie_word_embeddings = self.lm_head.is_tied

    @staticmethod
    def make_mlp(config, layer_idx: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> nn.Module:
        """Layer ``layer_idx``'s MLP (a family with experts overrides this)."""
        return dense_mlp(config, layer_idx, quant_config, prefix)

    @staticmethod
    def check_config(config) -> None:
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported (only 'silu')")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        """Hidden states of every token of the flat batch."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
