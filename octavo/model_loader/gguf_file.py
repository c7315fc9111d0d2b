"""A GGUF file read as a Hugging Face-style checkpoint: an HF config dict, HF parameter names and
shapes, dequantized weights, EOS ids and chat template from the metadata, and a tokenizer.

Only the header is parsed up front (``gguf_reader.GGUFReader``: scalars and strings decoded, the
vocabulary arrays stepped over, tensor data left in the memory map); tensors are dequantized
one at a time in :meth:`GGUFCheckpoint.iter_weights`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Container, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

GGUF_MAGIC = b"GGUF"

# GGUF general.architecture -> (HF architectures entry, HF model_type)
_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
}
# Whether the top-k routing weights are renormalised when the file does not say
# (``{arch}.expert_weights_norm``): llama.cpp's graphs for these architectures.
_MOE_NORM_DEFAULT = {"qwen2moe": False, "qwen3moe": True}

# Default rope base when the metadata omits it (llama.cpp's default).
_DEFAULT_ROPE_THETA = 10000.0

# Tensors outside any block.
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# Per-block tensors: GGUF suffix -> HF module path under model.layers.N.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # mixtures of experts: the router and the shared expert (the experts: _EXPERT_NAMES)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Stacked experts [E, out, in]: GGUF suffix -> the per-expert HF projection they split into.
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                 "ffn_down_exps": "down_proj"}

# GGUF tensors with no HF parameter counterpart. `rope_freqs` holds Llama 3 rope scaling
# factors, which HF expresses through config.rope_scaling instead.
_SKIPPED_TENSORS = {"rope_freqs.weight"}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")

_TORCH_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def gguf_to_hf_name(name: str) -> str | None:
    """HF parameter name of a GGUF tensor name; None when the name is unknown."""
    m = _BLOCK_RE.match(name)
    if m is not None:
        layer, kind, param = m.groups()
        if kind in _EXPERT_NAMES:  # all experts: split per expert by iter_weights
            return f"model.layers.{layer}.mlp.experts.{{}}.{_EXPERT_NAMES[kind]}.{param}"
        module = _BLOCK_NAMES.get(kind)
        return None if module is None else f"model.layers.{layer}.{module}.{param}"
    m = _GLOBAL_RE.match(name)
    if m is not None:
        kind, param = m.groups()
        module = _GLOBAL_NAMES.get(kind)
        return None if module is None else f"{module}.{param}"
    return None


def unpermute_rope_rows(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row interleaving of a llama q/k projection (weight or bias).

    llama.cpp's converter reorders, inside each head, the rows (i * half + j) of HF's
    rotate-half layout to (j * 2 + i), i in {0, 1}, j < half, so rotary pairs are adjacent.
    Here row (j * 2 + i) of each head goes back to (i * half + j).
    """
    rows = t.shape[0]
    if rows % (2 * n_head) != 0:
        raise ValueError(f"cannot unpermute {rows} rows into {n_head} heads of even size")
    half = rows // n_head // 2
    rest = tuple(t.shape[1:])
    return t.reshape(n_head, half, 2, *rest).transpose(1, 2).reshape(t.shape).contiguous()


class GGUFModelConfig(SimpleNamespace):
    """A GGUF file's model config: the fields :meth:`GGUFCheckpoint._build_hf_config` reads
    from the metadata as attributes (a missing one is an AttributeError, so ``getattr``
    defaults apply). Not a transformers config: ``AutoConfig.for_model`` imports the family's
    config module, which pulls ``torch.distributed.tensor``: ~0.7-1 s of the default model's
    start-up for fields the metadata already spells out. Built as ``GGUFModelConfig(**fields)``
    (no __init__ of its own: worker processes unpickle it through SimpleNamespace's)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class GGUFCheckpoint:
    """A GGUF file read as a Hugging Face-style checkpoint."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise ValueError(f"GGUF file not found: {path!r}")
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ValueError(f"cannot read GGUF file {path!r}: {e}") from e
        if magic != GGUF_MAGIC:
            raise ValueError(f"not a GGUF file (magic {magic!r}, want {GGUF_MAGIC!r}): {path!r}")

        from octavo.model_loader.gguf_reader import GGUFReader

        self._reader = GGUFReader(path)

        self._tensors = {t.name: t for t in self._reader.tensors}
        arch = self._meta("general.architecture")
        if arch not in _ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {arch!r} in {path!r}; "
                f"supported: {sorted(_ARCHITECTURES)}"
            )
        self.arch: str = arch

        self.bos_token_id: int | None = self._meta_int("tokenizer.ggml.bos_token_id")
        eos_ids: list[int] = []
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            tid = self._meta_int(f"tokenizer.ggml.{key}")
            if tid is not None and tid not in eos_ids:
                eos_ids.append(tid)
        self.eos_token_ids: list[int] = eos_ids
        self.chat_template: str | None = self._meta("tokenizer.chat_template")
        self.hf_config: dict[str, Any] = self._build_hf_config()

    # ------------------------------------------------------------------ metadata

    def _meta(self, key: str, default: Any = None) -> Any:
        return self._reader.fields.get(key, default)

    def _meta_int(self, key: str) -> int | None:
        value = self._meta(key)
        return None if value is None else int(value)

    def _arch_meta(self, key: str, default: Any = None) -> Any:
        return self._meta(f"{self.arch}.{key}", default)

    def _require(self, key: str) -> Any:
        value = self._arch_meta(key)
        if value is None:
            raise ValueError(f"GGUF file {self.path!r} lacks metadata {self.arch}.{key}")
        return value

    def _rope_scaling(self) -> dict[str, Any] | None:
        rtype = self._arch_meta("rope.scaling.type")
        factor = self._arch_meta("rope.scaling.factor")
        if rtype is None:
            # older files: a bare linear factor
            linear = self._arch_meta("rope.scale_linear")
            if linear is None or float(linear) == 1.0:
                return None
            rtype, factor = "linear", linear
        if rtype == "none" or factor is None:
            return None
        scaling: dict[str, Any] = {"rope_type": rtype, "type": rtype, "factor": float(factor)}
        orig = self._arch_meta("rope.scaling.original_context_length")
        if orig is not None:
            scaling["original_max_position_embeddings"] = int(orig)
        if rtype == "yarn":
            # llama.cpp's attn_factor keys do not map one-to-one onto HF's attention_factor
            # (HF derives it from the factor by default), so they are left out.
            for gguf_key, hf_key in (
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
            ):
                value = self._arch_meta(gguf_key)
                if value is not None:
                    scaling[hf_key] = float(value)
        return scaling

    def _build_hf_config(self) -> dict[str, Any]:
        hf_arch, model_type = _ARCHITECTURES[self.arch]
        hidden = int(self._require("embedding_length"))
        n_head = int(self._require("attention.head_count"))
        n_kv = int(self._arch_meta("attention.head_count_kv", n_head))
        # all supported families rotate the full head, so rope.dimension_count is a fallback
        head_dim = self._arch_meta("attention.key_length", self._arch_meta("rope.dimension_count"))
        head_dim = int(head_dim) if head_dim is not None else hidden // n_head

        embd = self._tensors.get("token_embd.weight")
        if embd is not None:
            vocab = int(embd.shape[-1])  # GGUF dims are [hidden, vocab]
        else:
            vocab = self._arch_meta("vocab_size")
            if vocab is None:
                vocab = len(self._meta("tokenizer.ggml.tokens", []))
            vocab = int(vocab)

        moe = self.arch in _MOE_NORM_DEFAULT
        ffn = self._arch_meta("feed_forward_length")
        if ffn is None:  # with experts in every layer the dense size is unused
            ffn = self._require("expert_feed_forward_length" if moe else "feed_forward_length")
        cfg: dict[str, Any] = {
            "architectures": [hf_arch],
            "model_type": model_type,
            "hidden_size": hidden,
            "intermediate_size": int(ffn),
            "num_hidden_layers": int(self._require("block_count")),
            "num_attention_heads": n_head,
            "num_key_value_heads": n_kv,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": float(self._require("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(self._arch_meta("rope.freq_base", _DEFAULT_ROPE_THETA)),
            "max_position_embeddings": int(self._require("context_length")),
            "vocab_size": vocab,
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0]
            if len(self.eos_token_ids) == 1
            else (list(self.eos_token_ids) or None),
            "torch_dtype": "float32",
        }
        if self.arch == "llama":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in self._tensors
            cfg["mlp_bias"] = False
        elif self.arch == "qwen3":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in self._tensors
        if moe:
            cfg.update(self._moe_config())
        scaling = self._rope_scaling()
        if scaling is not None:
            cfg["rope_scaling"] = scaling
        return cfg

    def _moe_config(self) -> dict[str, Any]:
        """Qwen2-MoE / Qwen3-MoE fields: every layer sparse, as llama.cpp runs them."""
        norm = self._arch_meta("expert_weights_norm", _MOE_NORM_DEFAULT[self.arch])
        cfg = {
            "num_experts": int(self._require("expert_count")),
            "num_experts_per_tok": int(self._require("expert_used_count")),
            "moe_intermediate_size": int(self._require("expert_feed_forward_length")),
            "norm_topk_prob": bool(norm),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
        if self.arch == "qwen2moe":
            shared = self._arch_meta("expert_shared_feed_forward_length")
            cfg["shared_expert_intermediate_size"] = int(shared or 0)
        return cfg

    # ------------------------------------------------------------------ weights

    def weight_names(self) -> list[str]:
        """HF names of the parameters iter_weights yields, in file order."""
        names = []
        for name, tensor in self._tensors.items():
            if name in _SKIPPED_TENSORS:
                continue
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                raise ValueError(f"unknown tensor {name!r} in GGUF file {self.path!r}")
            if "{}" in hf_name:  # stacked experts, GGUF dims [in, out, experts]
                names.extend(hf_name.format(e) for e in range(int(tensor.shape[-1])))
            else:
                names.append(hf_name)
        return names

    def tensor_types(self) -> dict[str, int]:
        """GGML type id of each weight tensor, by HF module prefix ("lm_head",
        "model.layers.0.mlp.gate_proj"), for quantization="gguf"."""
        out = {}
        for name, tensor in self._tensors.items():
            hf_name = gguf_to_hf_name(name)
            if hf_name is not None and hf_name.endswith(".weight"):
                out[hf_name[: -len(".weight")]] = int(tensor.tensor_type)
        return out

    def _dequantize(self, tensor: Any, dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(reversed(tensor.shape))  # GGUF dims are innermost first
        qtype = tensor.tensor_type
        data = tensor.data
        if tensor.type_name in ("F32", "F16"):
            # memory-mapped and read-only: copy while converting
            out = torch.from_numpy(np.array(data, copy=True)).to(dtype)
        elif tensor.type_name == "BF16":
            raw = np.array(data, copy=True).view(np.int16)
            out = torch.from_numpy(raw).view(torch.bfloat16).to(dtype)
        else:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            try:
                arr = dequantize(data, GGMLQuantizationType(qtype))
            except (NotImplementedError, ValueError) as e:
                raise ValueError(
                    f"GGUF tensor {tensor.name!r} in {self.path!r} has unsupported type "
                    f"{tensor.type_name}") from e
            out = torch.from_numpy(arr).to(dtype)
        return out.reshape(shape)

    def iter_weights(
        self, dtype: torch.dtype = torch.float32, raw: Container[str] = ()
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yields (HF parameter name, tensor) with every tensor dequantized to `dtype`, in HF shapes,
        except the HF names in `raw`: those come as the file's block rows, uint8 [out, row bytes].

        Tensors are dequantized one at a time. For arch llama, the q/k rows interleaved by
        llama.cpp's converter are put back into HF's rotate-half order.
        """
        n_head = self.hf_config["num_attention_heads"]
        n_kv = self.hf_config["num_key_value_heads"]
        for name, tensor in self._tensors.items():
            if name in _SKIPPED_TENSORS:
                continue
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                raise ValueError(f"unknown tensor {name!r} in GGUF file {self.path!r}")
            if "{}" in hf_name:  # stacked experts [E, out, in]: one tensor per expert
                raw_rows = hf_name in raw
                stack = tensor.data if raw_rows else self._dequantize(tensor, dtype)
                for e in range(stack.shape[0]):
                    t = torch.from_numpy(np.array(stack[e], copy=True)) if raw_rows else stack[e]
                    yield hf_name.format(e), t
                # An MoE model's experts are most of the file: without this its pages would
                # stay resident beside the repacked copies until the end of the load.
                self._reader.release_pages(tensor)
                continue
            if hf_name in raw:  # rows of blocks: the row permutation below applies as is
                t = torch.from_numpy(np.array(tensor.data, copy=True))
            else:
                t = self._dequantize(tensor, dtype)
            if hf_name.endswith("shared_expert_gate.weight") and t.dim() == 1:
                t = t.unsqueeze(0)  # llama.cpp stores the [1, H] gate as [H]
            if self.arch == "llama":
                if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
                    t = unpermute_rope_rows(t, n_head)
                elif hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
                    t = unpermute_rope_rows(t, n_kv)
            yield hf_name, t
        self.release_pages()

    def release_pages(self) -> None:
        """Drop the file's pages read so far from this process's resident set (the reader stays
        open and cached by open_gguf; a later read faults them in from the file again). After
        loading, every tensor has been copied, and the mapped file would otherwise count in the
        engine's RSS for its whole life (98 MB for the default model)."""
        self._reader.release_pages()

    # ------------------------------------------------------------------ tokenizer

    def load_tokenizer(self):
        """A transformers fast tokenizer built from the GGUF metadata, with EOS from the metadata
        (converted once per file, then loaded from the cache: tokenizer_cache.py)."""
        from octavo.model_loader.tokenizer_cache import cached_tokenizer

        return cached_tokenizer(self.path, self._build_tokenizer)

    def _build_tokenizer(self):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(
            os.path.dirname(os.path.abspath(self.path)), gguf_file=os.path.basename(self.path)
        )
        if self.eos_token_ids and tok.eos_token_id != self.eos_token_ids[0]:
            tok.eos_token = tok.convert_ids_to_tokens(self.eos_token_ids[0])
        if self.chat_template and not getattr(tok, "chat_template", None):
            tok.chat_template = self.chat_template
        return tok

    def __repr__(self) -> str:
        return f"GGUFCheckpoint({self.path!r}, arch={self.arch!r})"


@functools.lru_cache(maxsize=2)
def open_gguf(path: str) -> GGUFCheckpoint:
    """One parsed reader per file: config, tokenizer and weights all read the same file."""
    return GGUFCheckpoint(path)
