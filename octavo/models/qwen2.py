"""Qwen2: the Llama decoder with biases on the q/k/v projections."""

from __future__ import annotations

from octavo.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
