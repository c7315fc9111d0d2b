"""The workloads' cost model (benchmarks/workloads.py), against sums written out by hand."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.workloads import prefill_flops, shape_cost  # noqa: E402


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
