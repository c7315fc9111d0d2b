"""Qwen3: the Llama decoder with per-head RMSNorm on q and k and an explicit head_dim."""

from __future__ import annotations

from octavo.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
