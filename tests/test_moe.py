"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral) beyond greedy equality (test_correctness.py
runs them with every other family): logprobs against transformers', the layer against a
hand-written reference, and the stacked-expert loader's errors (quantized experts:
tests/quantization/test_quantized_moe.py)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.tiny_models import make_checkpoint

PROMPTS = [[5, 9, 77, 300, 12], [400, 3, 3, 3, 18, 250, 61, 7, 7, 90, 11]]


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe", "mixtral"])
def moe_checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return make_checkpoint(request.param, str(folder), distinct_norms=True)


def _hf_logprobs(folder: str, prompt: list[int], tokens: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [lp[start + i, t].item() for i, t in enumerate(tokens)]


def test_logprobs_match_transformers(moe_checkpoint):
    llm = LLM(model=moe_checkpoint, dtype="float32", skip_tokenizer_init=True)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        tokens = out.outputs[0].token_ids
        ours = [step[t].logprob for step, t in zip(out.outputs[0].logprobs, tokens, strict=True)]
        theirs = _hf_logprobs(moe_checkpoint, prompt, tokens)
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-4


def _reference(x, gate_w, w13, w2, top_k, renormalize):
    """Every token through every expert, weighted by a dense routing matrix (zeros off the
    top k): a different computation from the layer's sorted loop."""
    probs = torch.softmax(x @ gate_w.T, dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    dense = torch.zeros_like(probs).scatter(1, ids, weights)  # [T, E]
    inter = w2.shape[-1]
    gate_up = torch.einsum("th,eih->tei", x, w13)
    h = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    y = torch.einsum("tei,ehi->teh", h, w2)
    return torch.einsum("te,teh->th", dense, y)


@pytest.mark.parametrize("T", [1, 13])  # one token takes its own path (no sorting)
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_layer_equals_a_dense_reference(renormalize, top_k, T):
    from octavo.layers.fused_moe import FusedMoE

    torch.manual_seed(0)
    E, H, inter = 6, 24, 20
    layer = FusedMoE(E, top_k, H, inter, renormalize, prefix="m")
    gate_w = torch.randn(E, H)
    w13, w2 = torch.randn(E, 2 * inter, H) * 0.2, torch.randn(E, H, inter) * 0.2
    layer.gate.weight.data.copy_(gate_w)
    layer.experts.w13_weight.data.copy_(w13)
    layer.experts.w2_weight.data.copy_(w2)
    x = torch.randn(T, H)
    x[T // 4] = 0  # a uniform routing row: ties broken the same way by both (same topk call)
    torch.testing.assert_close(layer(x), _reference(x, gate_w, w13, w2, top_k, renormalize),
                               atol=1e-5, rtol=1e-5)
    assert layer(x[:0]).shape == (0, H)


def test_map_expert_name():
    from octavo.layers.fused_moe import map_expert_name

    assert map_expert_name("model.layers.3.mlp.experts.17.up_proj.weight") == (
        "model.layers.3.mlp.experts.w13_weight", (17, "w3"))
    assert map_expert_name("model.layers.3.mlp.experts.0.down_proj.weight") == (
        "model.layers.3.mlp.experts.w2_weight", (0, "w2"))
    assert map_expert_name("model.layers.3.mlp.gate.weight") is None
    assert map_expert_name("model.layers.3.mlp.experts.1.gate_proj.bias") is None
    assert map_expert_name("model.layers.3.mlp.experts.1.w1.weight") is None


def _rewrite(folder: str, dst: str, edit) -> str:
    """A copy of checkpoint ``folder`` whose tensors pass through ``edit(name, t)`` (None
    drops a tensor)."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(folder):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(folder, name), dst)
    state = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, t in state.items():
        t = edit(name, t)
        if t is not None:
            out[name] = t
    save_file(out, os.path.join(dst, "model.safetensors"))
    return dst


def test_a_missing_expert_is_named(tmp_path):
    src = make_checkpoint("qwen3_moe", str(tmp_path / "src"))
    gone = "model.layers.2.mlp.experts.5.up_proj.weight"
    dst = _rewrite(src, str(tmp_path / "dst"), lambda n, t: None if n == gone else t)
    with pytest.raises(ValueError, match=r"missing 1 tensors.*experts\.w13_weight#\(5, 'w3'\)"):
        LLM(model=dst, dtype="float32", skip_tokenizer_init=True)


def test_a_wrong_expert_shape_is_named(tmp_path):
    src = make_checkpoint("mixtral", str(tmp_path / "src"))
    bad = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    dst = _rewrite(src, str(tmp_path / "dst"), lambda n, t: t[:, :-1].contiguous() if n == bad else t)
    with pytest.raises(ValueError, match=rf"{bad}.*expert 2 w2"):
        LLM(model=dst, dtype="float32", skip_tokenizer_init=True)


def test_an_expert_beyond_the_config_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    src = make_checkpoint("qwen3_moe", str(tmp_path / "src"))
    dst = _rewrite(src, str(tmp_path / "dst"), lambda n, t: t)
    state = load_file(os.path.join(dst, "model.safetensors"))
    state["model.layers.0.mlp.experts.8.gate_proj.weight"] = state[
        "model.layers.0.mlp.experts.0.gate_proj.weight"].clone()
    save_file(state, os.path.join(dst, "model.safetensors"))
    with pytest.raises(ValueError, match=r"experts\.8\.gate_proj.*expert 8 out of range"):
        LLM(model=dst, dtype="float32", skip_tokenizer_init=True)


def test_routing_spreads_over_experts(moe_checkpoint):
    """The fixture exercises the experts: its tokens do not all go to one or two of them."""
    llm = LLM(model=moe_checkpoint, dtype="float32", skip_tokenizer_init=True)
    model = llm.llm_engine.executor.worker.runner.model
    from octavo.layers.fused_moe import FusedMoE

    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    x = torch.randn(64, layer.gate.input_size)
    _, ids = layer.route(x)
    assert len(set(ids.flatten().tolist())) >= math.ceil(0.75 * layer.num_experts)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_kernel_on_the_gpu_matches_the_loop(moe_checkpoint, monkeypatch, dtype):
    """On CUDA, OCTAVO_FUSED_MOE=1 (the grouped Triton kernel, decode steps in CUDA graphs)
    gives the expert loop's greedy tokens (eager) in float32. In bf16 the loop rounds each
    expert's output to bf16 where the kernel sums in float32, so this random model's flat
    logits split greedy runs at near-ties (2 of 4 runs equal on the H200, 2026-12-05): there
    the prompts' logprobs, computed from the same inputs, must stay close."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    prompts = [{"prompt_token_ids": p} for p in PROMPTS + [[3] * 40, list(range(10, 90))]]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=0)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FUSED_MOE", flag)
        llm = LLM(model=moe_checkpoint, dtype=dtype, skip_tokenizer_init=True)
        runner = llm.llm_engine.executor.worker.runner
        assert (runner.graph_runner is not None) == (flag == "1")
        runs[flag] = llm.generate(prompts, params, use_tqdm=False)
        llm.llm_engine.shutdown()
    tokens = {flag: [o.outputs[0].token_ids for o in outs] for flag, outs in runs.items()}
    if dtype == "float32":
        assert tokens["1"] == tokens["0"]
        return
    diffs = [abs(a[tok].logprob - lp.logprob)
             for fused, loop in zip(runs["1"], runs["0"], strict=True)
             for a, b in zip(fused.prompt_logprobs[1:], loop.prompt_logprobs[1:], strict=True)
             for tok, lp in b.items()]
    print(f"bf16 prompt logprobs, fused against the loop: mean |diff| "
          f"{sum(diffs) / len(diffs):.4f}, max {max(diffs):.4f} over {len(diffs)}")
    # bf16 keeps 8 bits: one rounding of a logit near 7 moves it by ~0.03
    assert sum(diffs) / len(diffs) < 0.03 and max(diffs) < 0.25
