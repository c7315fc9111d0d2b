"""Tokenizer loading for folders and GGUF files."""

from __future__ import annotations

from octavo.config import ModelConfig


def load_tokenizer(model_config: ModelConfig):
    if model_config.skip_tokenizer_init:
        return None
    if model_config.is_gguf and model_config.tokenizer is None:
        from octavo.model_loader.gguf_file import open_gguf

        return open_gguf(model_config.model).load_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_config.tokenizer or model_config.model)
