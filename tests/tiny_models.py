"""Tiny random-weight HF checkpoints of each claimed family, saved as safetensors folders."""

from __future__ import annotations

import os

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
              initializer_range=0.05, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 10000.0}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32, "rope_theta": 1000000.0,
                                                  "tie_word_embeddings": True}),
    # Mixture of experts: 8 experts, 2 a token; Qwen3-MoE with one dense layer among three
    # and the top-k weights not renormalised (Mixtral always renormalises).
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "head_dim": 32, "rope_theta": 1000000.0, "num_hidden_layers": 3, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 48, "decoder_sparse_step": 1,
        "mlp_only_layers": [1], "norm_topk_prob": False}),
    # Qwen2-MoE: q/k/v biases, a gated shared expert, the sparse layers every second one.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "rope_theta": 1000000.0, "num_hidden_layers": 3, "num_experts": 6,
        "num_experts_per_tok": 3, "moe_intermediate_size": 40,
        "shared_expert_intermediate_size": 72, "decoder_sparse_step": 2,
        "norm_topk_prob": False}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {
        "rope_theta": 1000000.0, "num_local_experts": 8, "num_experts_per_tok": 2,
        "intermediate_size": 48}),
}


def make_checkpoint(family: str, folder: str, seed: int = 0, distinct_norms: bool = False,
                    **overrides) -> str:
    """``overrides``: config fields on top of the family's (e.g. ``rope_scaling``).
    ``distinct_norms``: every RMSNorm its own random weights (transformers initialises them to
    ones, so a norm applied in the wrong place, or not at all, would still match)."""
    import torch
    import transformers

    cfg_name, model_name, extra = FAMILIES[family]
    kwargs = {**COMMON, **extra, **overrides}
    config = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    if family in ("qwen2", "qwen2_moe"):  # make the q/k/v biases matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.05)
    if distinct_norms:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(mean=1.0, std=0.2)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def copy_with_eos(src: str, dst: str, eos_token_id: int) -> str:
    """A copy of checkpoint ``src`` in ``dst`` whose config / generation config name
    ``eos_token_id`` as the EOS id."""
    import json
    import shutil

    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), dst)
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(dst, name)
        if os.path.exists(path):
            with open(path) as f:
                cfg = json.load(f)
            cfg["eos_token_id"] = eos_token_id
            with open(path, "w") as f:
                json.dump(cfg, f)
    return dst


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, one at a time (no padding)."""
    import torch

    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=0)
            outs.append(gen[0, len(p):].tolist())
    return outs


def add_word_tokenizer(folder: str) -> None:
    """A whitespace word-level tokenizer over the tiny vocabulary: "w17" is token 17."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), COMMON["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def make_word_llama(folder: str) -> str:
    """A tiny random Llama with the word tokenizer ("w17" is token 17): the servers' tests'
    model."""
    make_checkpoint("llama", folder)
    add_word_tokenizer(folder)
    return folder
