"""Mixture-of-experts GGUF files (llama.cpp's qwen3moe and qwen2moe): the config read from
the metadata, the stacked experts split per expert, and greedy tokens equal to transformers
loading the same file, float32 on the CPU, dequantized and with the attention layers kept in
their GGUF blocks (the experts too, where their type has a layout: gguf_experts.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers reads GGUF only with it

from gguf import GGMLQuantizationType as Q  # noqa: E402

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.model_loader.gguf_file import GGUFCheckpoint  # noqa: E402

H, HEADS, KV, HD, E, TOPK, INTER, SHARED, VOCAB, LAYERS = 64, 4, 2, 32, 6, 2, 32, 48, 256, 2


def _write(path: str, arch: str, seed: int = 0, experts=None) -> None:
    """``experts``: the stacked experts' GGML type (None: float32); arch "qwen3" / "qwen2":
    the same file with a dense MLP (FFN rows) instead of experts, every matrix in that type
    (qwen2: with q/k/v biases)."""
    rng = np.random.default_rng(seed)
    # Qwen3 heads are wider than hidden / heads, as in the real models; Qwen2's cannot be.
    HD = 32 if arch in ("qwen3moe", "qwen3") else H // HEADS  # noqa: N806
    dense = arch in ("qwen3", "qwen2")
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(96)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    if not dense:
        w.add_expert_count(E)
        w.add_expert_used_count(TOPK)
        w.add_expert_feed_forward_length(INTER)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(SHARED)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (VOCAB, H)}
    for n in range(LAYERS):
        b = f"blk.{n}."
        shapes.update({b + "attn_norm.weight": (H,), b + "attn_q.weight": (HEADS * HD, H),
                       b + "attn_k.weight": (KV * HD, H), b + "attn_v.weight": (KV * HD, H),
                       b + "attn_output.weight": (H, HEADS * HD), b + "ffn_norm.weight": (H,)})
        if dense:
            shapes.update({b + "ffn_gate.weight": (96, H), b + "ffn_up.weight": (96, H),
                           b + "ffn_down.weight": (H, 96)})
        else:
            shapes.update({b + "ffn_gate_inp.weight": (E, H),
                           b + "ffn_gate_exps.weight": (E, INTER, H),
                           b + "ffn_up_exps.weight": (E, INTER, H),
                           b + "ffn_down_exps.weight": (E, H, INTER)})
        if arch in ("qwen3moe", "qwen3"):
            shapes.update({b + "attn_q_norm.weight": (HD,), b + "attn_k_norm.weight": (HD,)})
        else:
            shapes.update({b + "attn_q.bias": (HEADS * HD,), b + "attn_k.bias": (KV * HD,),
                           b + "attn_v.bias": (KV * HD,)})
        if arch == "qwen2moe":
            shapes.update({b + "ffn_gate_inp_shexp.weight": (H,),
                           b + "ffn_gate_shexp.weight": (SHARED, H),
                           b + "ffn_up_shexp.weight": (SHARED, H),
                           b + "ffn_down_shexp.weight": (H, SHARED)})
    shapes.update({"output_norm.weight": (H,), "output.weight": (VOCAB, H)})
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            data = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            data = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        # The attention projections in Q8_0 (kept in their blocks on the CPU), the rest float.
        if name.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")):
            w.add_tensor(name, gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)
        elif ("_exps." in name or (dense and ".ffn_" in name and "norm" not in name)) \
                and experts is not None:
            w.add_tensor(name, gguf.quants.quantize(data, experts), raw_dtype=experts)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=["qwen3moe", "qwen2moe", "qwen3moe-Q8_0", "qwen2moe-Q4_0"])
def moe_gguf(request, tmp_path_factory):
    arch, _, experts = request.param.partition("-")
    path = str(tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf")
    _write(path, arch, experts=Q[experts] if experts else None)
    return arch, path


PROMPTS = [[5, 9, 77, 200, 12], [100, 3, 3, 18, 250, 61, 7, 7, 90, 11, 4, 4, 4]]


def test_config_and_expert_names(moe_gguf):
    arch, path = moe_gguf
    ck = GGUFCheckpoint(path)
    cfg = ck.hf_config
    assert cfg["architectures"] == [{"qwen3moe": "Qwen3MoeForCausalLM",
                                     "qwen2moe": "Qwen2MoeForCausalLM"}[arch]]
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (
        E, TOPK, INTER)
    assert cfg["norm_topk_prob"] is (arch == "qwen3moe")  # llama.cpp's graphs
    assert cfg.get("shared_expert_intermediate_size", 0) == (SHARED if arch == "qwen2moe" else 0)
    names = ck.weight_names()
    weights = dict(ck.iter_weights(torch.float32))
    assert list(weights) == names
    tensor = ck._tensors["blk.1.ffn_down_exps.weight"]
    stack = np.asarray(tensor.data)
    if tensor.type_name != "F32":
        stack = gguf.quants.dequantize(stack, Q(tensor.tensor_type))
    for e in range(E):
        got = weights[f"model.layers.1.mlp.experts.{e}.down_proj.weight"]
        assert got.shape == (H, INTER) and np.array_equal(got.numpy(), stack[e])
    if arch == "qwen2moe":
        assert weights["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, H)


def _hf_greedy(path: str, arch: str, n: int) -> list[list[int]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.tiny_models import hf_greedy

    folder, name = os.path.dirname(path), os.path.basename(path)
    # transformers 5.25's GGUF config mapping drops expert_feed_forward_length (and the shared
    # size) and defaults them to the full models' sizes: set them from the metadata; the
    # weights are still transformers' own conversion of the file.
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.moe_intermediate_size = INTER
    if arch == "qwen2moe":
        config.shared_expert_intermediate_size = SHARED
        config.norm_topk_prob = False
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config,
                                                 dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return hf_greedy(model, PROMPTS, n)


@pytest.mark.parametrize("quantized", [False, True])
def test_greedy_matches_transformers(moe_gguf, quantized):
    arch, path = moe_gguf
    expected = _hf_greedy(path, arch, 12)
    kw = {"quantization": "gguf"} if quantized else {"gguf_dequantize": True}
    llm = LLM(model=path, dtype="float32" if not quantized else "auto", device="cpu",
              skip_tokenizer_init=True, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    from octavo.quantization.gguf import GGUFLinearMethod

    model = llm.llm_engine.executor.worker.runner.model
    kept = [m for m in model.modules()
            if isinstance(getattr(m, "quant_method", None), GGUFLinearMethod)]
    assert len(kept) == (2 * LAYERS if quantized else 0)  # q/k/v and o, in Q8_0 blocks
    from octavo.quantization.gguf_experts import GGUFExperts

    blocks = [m for m in model.modules() if isinstance(m, GGUFExperts)]
    assert len(blocks) == (LAYERS if quantized and "-Q" in os.path.basename(path) else 0)
    if not quantized:
        assert got == expected
    else:  # int16 activations in the Q8_0 kernels may split a near-tie late in a sequence
        assert sum(a[:6] == b[:6] for a, b in zip(got, expected, strict=True)) == len(PROMPTS)


def test_one_token_call_equals_the_expert_loop(tmp_path):
    """Batch-1 decode's one C++ call for a token's experts (gguf_moe_token) against the loop
    over expert_forward that larger batches take."""
    from octavo.layers.fused_moe import FusedMoE, _experts_loop
    from octavo.quantization.gguf_experts import GGUFExperts

    path = str(tmp_path / "q.gguf")
    _write(path, "qwen3moe", experts=Q.Q4_0)
    llm = LLM(model=path, device="cpu", skip_tokenizer_init=True)
    model = llm.llm_engine.executor.worker.runner.model
    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    assert isinstance(layer.experts, GGUFExperts)
    torch.manual_seed(0)
    for _ in range(4):
        x = torch.randn(1, H)
        weights, ids = layer.route(x)
        one = layer.experts.token_forward(x, ids[0].tolist(), weights[0].tolist())
        if one is None:
            pytest.skip("the CPU kernels are not built here")
        loop = _experts_loop(x.repeat(2, 1), weights.repeat(2, 1), ids.repeat(2, 1),
                             layer.num_experts, layer.experts.expert_forward)[:1]
        torch.testing.assert_close(one, loop, atol=1e-5, rtol=1e-5)


def test_one_token_call_names_a_wrong_expert_shape(tmp_path):
    """gguf_moe_token runs the experts on the pool's threads: a shape error raised there
    reaches the caller as the error, naming the expert, and the layer still works after."""
    from octavo.layers.fused_moe import FusedMoE

    path = str(tmp_path / "q.gguf")
    _write(path, "qwen3moe", experts=Q.Q4_0)
    llm = LLM(model=path, device="cpu", skip_tokenizer_init=True)
    model = llm.llm_engine.executor.worker.runner.model
    experts = next(m for m in model.modules() if isinstance(m, FusedMoE)).experts
    x = torch.randn(1, H)
    good = experts.token_forward(x, [0, 1], [0.5, 0.5])
    if good is None:
        pytest.skip("the CPU kernels are not built here")
    right = experts.inter
    try:
        experts.inter = right + 32
        with pytest.raises(RuntimeError, match=r"expert \d+ has \d+ intermediate features"):
            experts.token_forward(x, [0, 1], [0.5, 0.5])
    finally:
        experts.inter = right
    torch.testing.assert_close(experts.token_forward(x, [0, 1], [0.5, 0.5]), good)


def test_the_benchmark_file_writer(tmp_path):
    """benchmarks/moe_cpu.py's qwen3moe writer at a tiny shape: the file parses with the
    metadata it claims and generates (its tokenizer is SmolLM2's, read from the file)."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from benchmarks.moe_cpu import write_moe_gguf

    try:
        from octavo.default_model import default_model_path

        default_model_path()
    except ValueError as e:
        pytest.skip(str(e))
    shape = dict(hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, experts=4, top_k=2,
                 expert_inter=32)
    path = str(tmp_path / "bench.gguf")
    write_moe_gguf(path, shape)
    cfg = GGUFCheckpoint(path).hf_config
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
            cfg["vocab_size"]) == (4, 2, 32, 49152)
    llm = LLM(model=path, device="cpu", max_model_len=128)
    out = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=3,
                                                 ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
