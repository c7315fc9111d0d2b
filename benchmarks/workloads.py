"""Workload definitions from ../shared/BENCHMARKS.md (W1, W2, W4) and their physical bounds."""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass

SHAPES = {
    # Qwen3-0.6B
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, torch_dtype="bfloat16",
                       hidden_act="silu", attention_bias=False),
    # Llama-3.1-8B
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama",
                         hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                         vocab_size=128256, tie_word_embeddings=False,
                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_theta=500000.0, torch_dtype="bfloat16", hidden_act="silu",
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    # Qwen3-30B-A3B: 128 experts, 8 a token, every layer sparse (3.3B of 30.5B parameters
    # active a token)
    "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                          hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                          vocab_size=151936, tie_word_embeddings=False,
                          max_position_embeddings=40960, rms_norm_eps=1e-6,
                          rope_theta=1000000.0, torch_dtype="bfloat16", hidden_act="silu",
                          attention_bias=False),
    # The Qwen3 layout shrunk until one CPU core makes over 20,000 tokens/s offline: the host
    # work per token dominates, as on a GPU, so it reproduces what serving costs per token
    # (W3's case) on a CPU. The vocabulary covers the benchmarks' prompt ids [0, 10000).
    "tiny-qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=32,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, intermediate_size=32, vocab_size=12000,
                       tie_word_embeddings=True, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, torch_dtype="float32",
                       hidden_act="silu", attention_bias=False),
}


def write_config(shape: str, **extra) -> str:
    """A folder holding only config.json, for load_format="dummy"; ``extra``: more config
    fields (a ``quantization_config``)."""
    folder = tempfile.mkdtemp(prefix=f"octavo-{shape}-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**SHAPES[shape], **extra}, f)
    return folder


def w1_requests(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """256 random prompts (100-1024 tokens), then 256 max_tokens (100-1024): 133,966 out."""
    random.seed(seed)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
               for _ in range(256)]
    max_tokens = [random.randint(100, 1024) for _ in range(256)]
    return prompts, max_tokens


@dataclass
class ShapeCost:
    weight_bytes: int  # read once per decode step
    kv_bytes_per_token: int
    flops_per_token: float


def _expert_bytes(c: dict, dtype_bytes: int) -> int:
    """One expert's gate, up and down weights."""
    return 3 * c["hidden_size"] * c["moe_intermediate_size"] * dtype_bytes


def shape_cost(shape: str, dtype_bytes: int = 2) -> ShapeCost:
    """A mixture of experts (``num_experts``, every layer sparse) counts every expert in the
    bytes a step reads (a large batch touches them all: the bound is for that case) and the
    ``num_experts_per_tok`` it runs in the FLOPs."""
    c = SHAPES[shape]
    h, n_layers, inter = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    attn = h * (q + 2 * kv) + q * h
    mlp = active = 3 * h * inter
    if c.get("num_experts"):
        expert = _expert_bytes(c, 1)  # parameters
        mlp = c["num_experts"] * expert + h * c["num_experts"]  # experts and router
        active = c["num_experts_per_tok"] * expert + h * c["num_experts"]
    lm_head = c["vocab_size"] * h
    # the embedding lookup reads a few rows only
    params = n_layers * (attn + mlp) + lm_head
    active_params = n_layers * (attn + active) + lm_head
    return ShapeCost(weight_bytes=params * dtype_bytes,
                     kv_bytes_per_token=2 * n_layers * kv * dtype_bytes,
                     flops_per_token=2.0 * active_params)


def routed_expert_bytes(shape: str, batch: int, dtype_bytes: int = 2) -> float:
    """Expert weight bytes a decode step of ``batch`` tokens reads (0 for a dense model): only
    the experts the batch routes to, in expectation under uniform routing (each token picks k
    of E distinct experts, so an expert goes unread with probability (1 - k/E) ** batch;
    Qwen3-30B-A3B: 8 a layer at one token, 82 at 16, all 128 at 256)."""
    c = SHAPES[shape]
    e = c.get("num_experts")
    if not e:
        return 0.0
    touched = e * (1.0 - (1.0 - c["num_experts_per_tok"] / e) ** batch)
    return c["num_hidden_layers"] * touched * _expert_bytes(c, dtype_bytes)


def decode_weight_bytes(shape: str, batch: int, dtype_bytes: int = 2) -> float:
    """Weight bytes a decode step of ``batch`` tokens reads: ``shape_cost``'s, with a mixture
    of experts' experts counted as :func:`routed_expert_bytes`."""
    c = SHAPES[shape]
    full = shape_cost(shape, dtype_bytes).weight_bytes
    e = c.get("num_experts")
    every = c["num_hidden_layers"] * e * _expert_bytes(c, dtype_bytes) if e else 0
    return full - every + routed_expert_bytes(shape, batch, dtype_bytes)


def prefill_flops(shape: str, prompts: int, context: int) -> tuple[float, float]:
    """(GEMM, attention) FLOPs of one step prefilling ``prompts`` whole prompts of
    ``context`` tokens: every token through every linear layer, the LM head for each prompt's
    last token only, and causal attention (QK^T and PV over the triangle, two FLOPs per
    multiply-add each)."""
    c = SHAPES[shape]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    lm_head = 2.0 * c["vocab_size"] * c["hidden_size"]
    gemm = prompts * (context * (shape_cost(shape).flops_per_token - lm_head) + lm_head)
    attn = (prompts * c["num_hidden_layers"] * 4.0 * c["num_attention_heads"] * head_dim
            * context * (context + 1) / 2)
    return gemm, attn


def decode_bound_seconds(prompt_lens: list[int], out_lens: list[int], cost: ShapeCost,
                         bandwidth: float, flops: float, max_batch: int = 256) -> float:
    """Lower bound on wall time: every decode step reads the weights once and every K/V byte
    of the running contexts; prefill costs its FLOPs. Requests run all at once (max_batch)."""
    assert len(prompt_lens) <= max_batch
    steps = max(out_lens)
    kv_reads = sum(o * p + o * (o + 1) // 2 for p, o in zip(prompt_lens, out_lens))
    mem = steps * cost.weight_bytes + kv_reads * cost.kv_bytes_per_token
    prefill = sum(prompt_lens) * cost.flops_per_token
    return mem / bandwidth + prefill / flops


# Published figures for the H200 (HBM3e bandwidth, dense bf16 tensor-core rate).
H200_BANDWIDTH = 4.8e12
H200_BF16_FLOPS = 989e12
# Published (bytes/s, dense bf16 FLOP/s) by a substring of torch's device name, most specific
# first: the H200; the H100 SXM5 ("NVIDIA H100 80GB HBM3": 3.35 TB/s, 989 TFLOP/s), NVL
# (3.9 TB/s, 835) and PCIe (2.0 TB/s, 756). Every fraction of a bound is then against the
# card's datasheet, not a measured copy (an H100 SXM copies at ~3.0 of its 3.35 TB/s).
PUBLISHED = (("H200", H200_BANDWIDTH, H200_BF16_FLOPS),
             ("H100 NVL", 3.9e12, 835e12),
             ("H100 PCIe", 2.0e12, 756e12),
             ("H100 80GB HBM3", 3.35e12, 989e12))


def published_limits(name: str) -> tuple[float, float] | None:
    """(bytes/s, FLOP/s) of the card torch names ``name``, None for a card not listed."""
    for key, bandwidth, flops in PUBLISHED:
        if key in name:
            return bandwidth, flops
    return None


def device_limits() -> tuple[float, float, str]:
    """(bytes/s, FLOP/s, source) for the current CUDA device: its published figures
    (``PUBLISHED``), else a measured copy bandwidth and a nominal FLOP rate."""
    import torch

    name = torch.cuda.get_device_name(0)
    published = published_limits(name)
    if published is not None:
        bandwidth, flops = published
        return (bandwidth, flops, f"{name}: published {bandwidth / 1e12:.2f} TB/s, "
                f"{flops / 1e12:.0f} TFLOP/s bf16")
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    bw = 2 * 10 * x.numel() / (start.elapsed_time(end) / 1e3)
    return bw, 500e12, f"{name}: measured copy {bw / 1e12:.2f} TB/s, nominal 500 TFLOP/s"
