"""HF `architectures` names -> model classes, imported lazily."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": "octavo.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "octavo.models.llama:LlamaForCausalLM",
    "MixtralForCausalLM": "octavo.models.mixtral:MixtralForCausalLM",
    "Qwen2ForCausalLM": "octavo.models.qwen2:Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM": "octavo.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM": "octavo.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "octavo.models.qwen3_moe:Qwen3MoeForCausalLM",
}


def register_model(architecture: str, target: str) -> None:
    _MODELS[architecture] = target


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_architecture(architectures: list[str] | None) -> str:
    for arch in architectures or []:
        if arch in _MODELS:
            return arch
    raise ValueError(
        f"model architectures {architectures} are not supported "
        f"(supported: {supported_architectures()})")


def get_model_class(architecture: str):
    module, cls = _MODELS[resolve_architecture([architecture])].split(":")
    return getattr(importlib.import_module(module), cls)
