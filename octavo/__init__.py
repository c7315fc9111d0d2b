"""Octavo: high-throughput, memory-efficient LLM inference with a vLLM-compatible API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.sampling_params import (
    BeamSearchParams,
    GuidedDecodingParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineArgs",
    "SamplingParams",
    "BeamSearchParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestOutputKind",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
]

if TYPE_CHECKING:
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.llm_engine import LLMEngine
    from octavo.entrypoints.llm import LLM

_LAZY = {
    "LLM": "octavo.entrypoints.llm",
    "LLMEngine": "octavo.engine.llm_engine",
    "EngineArgs": "octavo.engine.arg_utils",
}


def __getattr__(name: str):
    # Lazy so that torch-free parts (scheduler, sampling params) import without torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'octavo' has no attribute {name!r}")
