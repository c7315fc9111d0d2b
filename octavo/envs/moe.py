"""Mixture-of-experts switches: the grouped kernels, the routing launch, the integer GEMV."""

from __future__ import annotations

from octavo.envs._parse import _flag, _int


def fused_moe() -> bool:
    """OCTAVO_FUSED_MOE (default on; 0: the loop): on CUDA, mixture-of-experts layers run the
    grouped Triton kernels (octavo/kernels/fused_moe.py for float experts, fused_moe_int.py
    for GPTQ / AWQ / compressed-tensors integer experts) instead of a loop over experts, and
    MoE models' decode steps are captured in CUDA graphs. Qwen3-30B-A3B shape on one H200
    (2026-12-05): 6.6 ms per token at batch 1 against the loop's 79.4, 15.4 against 608 at 16."""
    return _flag("OCTAVO_FUSED_MOE", True)


def moe_int_gemv_max_pairs() -> int:
    """OCTAVO_MOE_INT_GEMV (default 128; 0 turns it off): integer MoE experts
    (octavo/kernels/fused_moe_int.py) run batches of up to this many (token, expert) pairs
    through the grouped CUDA-core GEMV (octavo/kernels/w4a16_gemv.py) instead of the
    tensor-core launches. H100, Qwen3-30B-A3B W4A16 (session 43): 23.6 against 43.7 us a
    layer at 8 pairs, 137 against 198 at 128; the engine's batch 1 4.22 -> 3.30 ms per token,
    batch 16 11.35 -> 9.68. Beyond 128 pairs: not measured."""
    return _int("OCTAVO_MOE_INT_GEMV", 128, "(token, expert) pairs")


def moe_route() -> bool:
    """OCTAVO_MOE_ROUTE (default on): with the fused MoE kernel, decode batches route and align
    their (token, expert) pairs in one launch (octavo/kernels/moe_route.py); off, torch ops
    (30 a layer)."""
    return _flag("OCTAVO_MOE_ROUTE", True)
