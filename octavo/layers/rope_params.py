"""RoPE parameters read from a Hugging Face config: base, scaling variant, and the longest
position the scaled embedding covers. Torch-free: the engine config derives ``max_model_len``
from it.

Both config forms are accepted: transformers-5 ``rope_parameters`` (which carries
``rope_theta``) and the older top-level ``rope_theta`` / ``rope_scaling``; the variant is named
by ``rope_type`` or the legacy ``type`` key.
"""

from __future__ import annotations

# Variants whose ``max_position_embeddings`` already is the extended length (no factor applied).
_UNSCALED_LENGTH = ("default", "llama3", "longrope", "su")
# Variants that need the pretraining window; like transformers, it falls back to a top-level
# ``original_max_position_embeddings`` (Phi-3 style), then to ``max_position_embeddings``.
_NEEDS_ORIGINAL = ("llama3", "yarn", "longrope")


def rope_params_from_config(hf_config) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling), the scaling dict normalised: ``rope_type`` always set,
    ``original_max_position_embeddings`` filled in where the variant needs it, a yarn
    ``factor`` left out derived as max_position_embeddings / original. None when unscaled."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None)) or 10000.0
    scaling = getattr(hf_config, "rope_scaling", None)
    if params and params.get("rope_type", params.get("type", "default")) != "default":
        scaling = params
    if scaling is None:
        return float(theta), None
    scaling = dict(scaling)
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    kind = scaling["rope_type"]
    if kind == "default":
        return float(theta), None
    max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
    if kind in _NEEDS_ORIGINAL:
        top = getattr(hf_config, "original_max_position_embeddings", None)
        if top is not None:
            scaling["original_max_position_embeddings"] = top
        scaling.setdefault("original_max_position_embeddings", max_pos)
    if kind == "yarn" and scaling.get("factor") is None:
        scaling["factor"] = max_pos / scaling["original_max_position_embeddings"]
    return float(theta), scaling


def rope_max_position(max_position_embeddings: int, rope_scaling: dict | None) -> int:
    """Longest sequence the (scaled) rotary table covers, as vLLM derives it: yarn ->
    original_max_position_embeddings * factor; llama3 / longrope -> max_position_embeddings
    (already the extended length); other variants (linear, dynamic) ->
    max_position_embeddings * factor."""
    if rope_scaling is None:
        return int(max_position_embeddings)
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind in _UNSCALED_LENGTH:
        return int(max_position_embeddings)
    factor = float(rope_scaling.get("factor") or 1.0)
    if kind == "yarn":
        return int(rope_scaling["original_max_position_embeddings"] * factor)
    return int(max_position_embeddings * factor)


def model_max_position(hf_config) -> int:
    """The model's own length limit: ``max_position_embeddings`` extended by RoPE scaling."""
    max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
    return rope_max_position(max_pos, rope_params_from_config(hf_config)[1])
