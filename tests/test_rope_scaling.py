"""RoPE scaling read from HF configs: cos/sin tables against transformers' formulas, and the
model length each variant allows."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from octavo.engine.arg_utils import _resolve_max_len  # noqa: E402
from octavo.layers.rope_params import (  # noqa: E402
    model_max_position,
    rope_max_position,
    rope_params_from_config,
)
from octavo.layers.rope_scaling import dynamic_ntk_seq_len  # noqa: E402
from octavo.layers.rotary import RotaryEmbedding  # noqa: E402

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, num_hidden_layers=1, vocab_size=128)

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
CASES = {
    "default": (dict(max_position_embeddings=256), 256),
    "linear": (dict(max_position_embeddings=64,
                    rope_scaling={"rope_type": "linear", "factor": 4.0}), 256),
    "linear-legacy-type-key": (dict(max_position_embeddings=64,
                                    rope_scaling={"type": "linear", "factor": 2.0}), 128),
    "llama3": (dict(max_position_embeddings=512, rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64}), 512),
    "yarn": (dict(max_position_embeddings=256, rope_scaling=YARN), 256),
    "yarn-qwen-style": (dict(max_position_embeddings=64, rope_theta=1e6, head_dim=32,
                             rope_scaling=YARN), 256),
    "yarn-betas-attention-factor-no-truncate": (
        dict(max_position_embeddings=256, rope_scaling={
            **YARN, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.3,
            "truncate": False}), 256),
    "yarn-mscale": (dict(max_position_embeddings=256, rope_scaling={
        **YARN, "mscale": 0.9, "mscale_all_dim": 0.7}), 256),
    "yarn-rope-parameters": (dict(max_position_embeddings=256, rope_parameters={
        **YARN, "rope_theta": 50000.0}), 256),
    "yarn-original-from-max-position": (dict(max_position_embeddings=128, rope_scaling={
        "type": "yarn", "factor": 2.0}), 256),
}


def _config(**kwargs):
    return transformers.LlamaConfig(**BASE, **kwargs)


def _ours(config) -> RotaryEmbedding:
    theta, scaling = rope_params_from_config(config)
    return RotaryEmbedding(config.head_dim, config.max_position_embeddings, theta, scaling)


def _split(rope: RotaryEmbedding) -> tuple[torch.Tensor, torch.Tensor]:
    half = rope.head_dim // 2
    return rope.cos_sin_cache[:, :half], rope.cos_sin_cache[:, half:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_table_matches_transformers(case):
    kwargs, length = CASES[case]
    config = _config(**kwargs)
    rope = _ours(config)
    assert rope.num_positions == length == model_max_position(config)
    hf = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = hf(x, torch.arange(length)[None])
    half = config.head_dim // 2
    ours_cos, ours_sin = _split(rope)
    torch.testing.assert_close(ours_cos, cos[0, :, :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_sin, sin[0, :, :half], rtol=0, atol=1e-6)
    # The yarn cases really scale cos/sin (mscale), and every scaled case differs from RoPE.
    if "yarn" in case:
        assert hf.attention_scaling != 1.0
        assert ours_cos[0].max().item() == pytest.approx(hf.attention_scaling)
    if case != "default":
        plain = _ours(_config(max_position_embeddings=length,
                              rope_theta=rope_params_from_config(config)[0],
                              head_dim=config.head_dim))
        assert not torch.allclose(_split(plain)[0], ours_cos, atol=1e-3)


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_dynamic_is_transformers_at_the_table_length(factor):
    """The static dynamic-NTK table is transformers' dynamic frequencies for a sequence of the
    table's full length (max_position_embeddings * factor), at every position."""
    config = _config(max_position_embeddings=64,
                     rope_scaling={"rope_type": "dynamic", "factor": factor})
    rope = _ours(config)
    seq_len = dynamic_ntk_seq_len(64, factor)
    assert rope.num_positions == seq_len == int(64 * factor) == model_max_position(config)
    inv_freq, scale = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=seq_len)
    assert scale == 1.0
    angles = torch.arange(seq_len)[:, None].float() * inv_freq[None, :]
    ours_cos, ours_sin = _split(rope)
    torch.testing.assert_close(ours_cos, angles.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_sin, angles.sin(), rtol=0, atol=1e-6)
    # Not transformers' short-sequence behaviour (plain RoPE): the table is one fixed choice.
    plain, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=10)
    assert not torch.allclose(plain, inv_freq)


def test_unknown_and_partial_rotary_are_rejected():
    with pytest.raises(ValueError, match="'longrope' is not supported"):
        RotaryEmbedding(16, 64, 10000.0, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
        RotaryEmbedding(16, 64, 10000.0, {"rope_type": "linear", "factor": 2.0,
                                          "partial_rotary_factor": 0.5})


@pytest.mark.parametrize("scaling, expected", [
    (None, 1000),
    ({"rope_type": "linear", "factor": 2.0}, 2000),
    ({"rope_type": "dynamic", "factor": 3.0}, 3000),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 500}, 2000),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1000}, 4000),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 100}, 1000),
    ({"rope_type": "longrope", "factor": 8.0, "original_max_position_embeddings": 100}, 1000),
])
def test_max_position_follows_vllm(scaling, expected):
    assert rope_max_position(1000, scaling) == expected


def test_max_model_len_honours_scaling_and_window():
    config = _config(max_position_embeddings=64, rope_scaling={"rope_type": "linear",
                                                               "factor": 4.0})
    assert _resolve_max_len(None, config) == 256
    assert _resolve_max_len(200, config) == 200
    with pytest.raises(ValueError, match="max_model_len=257.*256"):
        _resolve_max_len(257, config)
    qwen = transformers.Qwen2Config(**BASE, max_position_embeddings=1024, sliding_window=512,
                                    use_sliding_window=True,
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 1024})
    assert model_max_position(qwen) == 4096
    assert _resolve_max_len(None, qwen) == 512  # no sliding-window attention: stay inside it


def test_phi3_style_top_level_original_wins():
    config = _config(max_position_embeddings=1024, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
    config.original_max_position_embeddings = 256
    _, scaling = rope_params_from_config(config)
    assert scaling["original_max_position_embeddings"] == 256
    assert model_max_position(config) == 1024
