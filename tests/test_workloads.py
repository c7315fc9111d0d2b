"""The workloads' cost model (benchmarks/workloads.py), against sums written out by hand."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.workloads import (  # noqa: E402
    decode_weight_bytes,
    prefill_flops,
    published_limits,
    routed_expert_bytes,
    shape_cost,
)


def test_qwen3_weights_read_per_decode_step():
    # Per layer: q 2048 + k 1024 + v 1024 rows of 1024, o 1024 x 2048, gate / up / down
    # 3 x 1024 x 3072; 28 layers; the tied LM head / embedding 151936 x 1024 once; bf16.
    per_layer = 1024 * 4096 + 2048 * 1024 + 3 * 1024 * 3072
    params = 28 * per_layer + 151936 * 1024
    cost = shape_cost("qwen3-0.6b")
    assert cost.weight_bytes == 2 * params == 1_191_968_768
    assert cost.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2  # K and V, 28 layers, bf16
    assert cost.flops_per_token == 2.0 * params


def test_prefill_flops_of_a_w1_step():
    # 32 prompts of 512 tokens: the linear layers for all 16,384 tokens, the LM head for 32.
    gemm, attn = prefill_flops("qwen3-0.6b", 32, 512)
    per_layer = 1024 * 4096 + 2048 * 1024 + 3 * 1024 * 3072
    assert gemm == 2.0 * (16384 * 28 * per_layer + 32 * 151936 * 1024)
    # QK^T and PV: 2 x 2 FLOPs per (query, key <= query) pair, per head (16 x 128), layer.
    assert attn == 32 * 28 * 16 * 128 * 4.0 * (512 * 513 / 2)
    assert round(gemm / 1e12, 2) == 14.44 and round(attn / 1e9) == 964


def test_moe_shape_counts_every_expert_read_and_the_active_ones_computed():
    # Qwen3-30B-A3B: attention q 4096 + k 512 + v 512 rows of 2048, o 2048 x 4096; 128
    # experts of 3 x 2048 x 768 and a 128 x 2048 router; 48 layers; LM head 151936 x 2048.
    attn = 2048 * 5120 + 4096 * 2048
    expert = 3 * 2048 * 768
    params = 48 * (attn + 128 * expert + 2048 * 128) + 151936 * 2048
    active = 48 * (attn + 8 * expert + 2048 * 128) + 151936 * 2048
    cost = shape_cost("qwen3-30b-a3b")
    assert cost.weight_bytes == 2 * params
    assert cost.flops_per_token == 2.0 * active
    assert cost.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_moe_shape_builds_the_model_it_claims():
    """The shape's config builds Octavo's Qwen3-MoE with those parameters (meta tensors): the
    cost model's weights plus the embedding table and the norms."""
    import torch
    from transformers import AutoConfig

    from benchmarks.workloads import SHAPES
    from octavo.attention.torch_backend import TorchAttentionBackend
    from octavo.models.registry import get_model_class

    cfg = dict(SHAPES["qwen3-30b-a3b"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    cls = get_model_class(config.architectures[0])
    with torch.device("meta"):
        model = cls(config, backend=TorchAttentionBackend())
    counted = sum(p.numel() for p in model.parameters())
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert counted == shape_cost("qwen3-30b-a3b").weight_bytes // 2 + 151936 * 2048 + norms


def test_decode_weight_bytes_counts_the_routed_experts():
    # Dense: every weight every step. Qwen3-30B-A3B at one token: attention, routers, LM head
    # and 8 of 128 experts a layer; the expected experts grow with the batch towards all.
    assert decode_weight_bytes("qwen3-0.6b", 32) == shape_cost("qwen3-0.6b").weight_bytes
    full = shape_cost("qwen3-30b-a3b").weight_bytes
    expert = 3 * 2048 * 768 * 2
    assert decode_weight_bytes("qwen3-30b-a3b", 1) == full - 48 * 120 * expert
    sizes = [decode_weight_bytes("qwen3-30b-a3b", b) for b in (1, 16, 64, 256)]
    assert sizes == sorted(sizes) and full - sizes[-1] < 48 * expert * 0.01
    assert routed_expert_bytes("qwen3-0.6b", 4) == 0
    assert routed_expert_bytes("qwen3-30b-a3b", 1) == 48 * 8 * expert


def test_published_limits_by_card_name():
    """Fractions of a bound are against the card's datasheet: torch's names for the H200 and
    the three H100s map to their own figures (the NVL and PCIe names before the SXM one's)."""
    assert published_limits("NVIDIA H200") == (4.8e12, 989e12)
    assert published_limits("NVIDIA H100 80GB HBM3") == (3.35e12, 989e12)
    assert published_limits("NVIDIA H100 NVL") == (3.9e12, 835e12)
    assert published_limits("NVIDIA H100 PCIe") == (2.0e12, 756e12)
    assert published_limits("NVIDIA A100-SXM4-80GB") is None  # measured there
