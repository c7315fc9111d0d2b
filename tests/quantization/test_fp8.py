"""FP8 weights: quantized at load (``quantization="fp8"`` per tensor, ``"fp8-per-channel"``),
and pre-quantized checkpoints (AutoFP8-style per-tensor ``weight_scale`` with a static
``input_scale``; transformers' block-scaled ``weight_scale_inv``, cross-checked against
transformers' own dequantizing loader). The ``torch._scaled_mm`` path runs on the CPU too
(torch 2.13 has a CPU kernel), forced here; on the GPU it is the default (marked gpu)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.quantization import fp8
from tests.tiny_models import COMMON, make_checkpoint

PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % COMMON["vocab_size"] for i in range(n)]}
           for n in (1, 6, 13)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
E4M3_MANTISSA = 3


@pytest.fixture(scope="module")
def float_ckpt(tmp_path_factory):
    return make_checkpoint("qwen2", str(tmp_path_factory.mktemp("fp8") / "src"))


def _llm(model: str, **kwargs) -> LLM:
    """On the CPU unless ``device`` says otherwise (the GPU cases ask for CUDA)."""
    kwargs.setdefault("device", "cpu")
    return LLM(model=model, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               **kwargs)


def _greedy(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _first_step(llm: LLM) -> list[dict[int, float]]:
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=10)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [{t: lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]


def _model(llm: LLM):
    return llm.llm_engine.executor.worker.runner.model


def _force_scaled_mm(monkeypatch) -> None:
    """Send fp8 layers through torch._scaled_mm on the CPU (skip where torch has no CPU
    kernel for it)."""
    a = torch.ones(16, 16).to(fp8.FP8)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16),
                         out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"no CPU torch._scaled_mm here: {e}")
    monkeypatch.setattr(fp8, "use_scaled_mm", lambda device: True)


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_round_trip(per_channel):
    """Every value comes back within half an e4m3 step: 2**-4 relative for normals, half the
    smallest subnormal (2**-10 of the scale) near zero; the largest magnitude maps to 448."""
    torch.manual_seed(0)
    w = torch.randn(48, 80) * torch.logspace(-3, 0, 48)[:, None]
    q, scale = fp8.quantize_fp8(w, per_channel)
    assert q.dtype == torch.float8_e4m3fn
    assert scale.shape == ((48,) if per_channel else ())
    row_scale = scale if per_channel else scale.expand(48)
    back = fp8.dequantize_fp8(q, row_scale)
    bound = w.abs() * 2.0 ** -(E4M3_MANTISSA + 1) + row_scale[:, None] * 2.0 ** -10
    assert bool(((back - w).abs() <= bound * (1 + 1e-6)).all())
    amax = q.float().abs().amax(dim=1) if per_channel else q.float().abs().amax()
    assert bool((amax == 448).all())


def test_fp8_by_hand():
    """amax 1.0: scale 1/448. 0.3 * 448 = 134.4 lies between e4m3's 128 and 144 (3 mantissa
    bits: steps of 16 in [128, 256)): 128. 2**-12 * 448 = 0.109375 = 1.75 * 2**-4 is exact."""
    w = torch.tensor([[1.0, -0.5, 0.3, 2.0 ** -12]])
    q, scale = fp8.quantize_fp8(w, per_channel=False)
    assert scale.item() == pytest.approx(1 / 448)
    assert q.float().tolist() == [[448.0, -224.0, 128.0, 0.109375]]


def _close_to_float(float_llm_steps, steps, tol=0.1):
    for ref, got in zip(float_llm_steps, steps):
        common = set(ref) & set(got)
        assert len(common) >= 5
        assert max(abs(ref[t] - got[t]) for t in common) < tol


@pytest.mark.parametrize("name", ["fp8", "fp8-per-channel"])
@pytest.mark.parametrize("scaled_mm", [False, True])
def test_online_fp8_close_to_float(float_ckpt, name, scaled_mm, monkeypatch):
    """Quantized at load, the model's first-step distribution stays within 0.1 nats of the
    float model's on its top tokens: dequantized weights on the CPU, or the fp8 GEMM
    (``torch._scaled_mm`` with per-token activation scales) forced on the CPU."""
    expect = _first_step(_llm(float_ckpt))
    if scaled_mm:
        _force_scaled_mm(monkeypatch)
    llm = _llm(float_ckpt, quantization=name)
    buffers = {n.rsplit(".", 1)[-1] for n, _ in _model(llm).named_buffers()}
    assert ("weight_fp8" in buffers) == scaled_mm
    _close_to_float(expect, _first_step(llm))
    assert all(len(t) == GREEDY.max_tokens for t in _greedy(llm))


def _write_fp8_checkpoint(src: str, dst: str, qcfg: dict, block=None) -> str:
    """``src`` with each projection in fp8: per tensor (``weight_scale``, plus a static
    ``input_scale``), or in blocks (``weight_scale_inv``)."""
    from safetensors.torch import load_file, save_file

    os.makedirs(dst)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), dst)
    out = {}
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        if not name.endswith("_proj.weight"):
            out[name] = t
            continue
        if block is None:
            q, scale = fp8.quantize_fp8(t, per_channel=False)
            out[name], out[name + "_scale"] = q, scale
            out[name[:-len("weight")] + "input_scale"] = torch.tensor(0.02)
            continue
        rows, cols = t.shape
        rb, cb = -(-rows // block[0]), -(-cols // block[1])
        padded = torch.zeros(rb * block[0], cb * block[1])
        padded[:rows, :cols] = t
        blocks = padded.view(rb, block[0], cb, block[1])
        scale = (blocks.abs().amax(dim=(1, 3)) / 448).clamp(min=1e-12)
        q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view_as(padded)
        out[name], out[name + "_scale_inv"] = q[:rows, :cols].to(torch.float8_e4m3fn), scale
    save_file(out, os.path.join(dst, "model.safetensors"))
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = qcfg
    with open(path, "w") as f:
        json.dump(cfg, f)
    return dst


def _dequantized_twin(quant: str, dst: str, block=None) -> str:
    """A float checkpoint holding exactly what the fp8 one (per tensor, or in ``block``s)
    stands for."""
    from safetensors.torch import load_file, save_file

    os.makedirs(dst)
    for name in os.listdir(quant):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(quant, name), dst)
    state = load_file(os.path.join(quant, "model.safetensors"))
    out = {}
    for name, t in state.items():
        if name.endswith(("_scale", "_scale_inv")):
            continue
        if t.dtype == torch.float8_e4m3fn and block is not None:
            out[name] = fp8.dequantize_blocks(t, state[name + "_scale_inv"], block)
        elif t.dtype == torch.float8_e4m3fn:
            out[name] = t.float() * state[name + "_scale"].float()
        else:
            out[name] = t
    save_file(out, os.path.join(dst, "model.safetensors"))
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    del cfg["quantization_config"]
    with open(path, "w") as f:
        json.dump(cfg, f)
    return dst


def test_prequantized_per_tensor_checkpoint(float_ckpt, tmp_path):
    """AutoFP8's layout (per-tensor weight_scale for each of q/k/v, static input_scale):
    detected, and the tokens of the float checkpoint holding ``fp8 * weight_scale``."""
    qcfg = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    quant = _write_fp8_checkpoint(float_ckpt, str(tmp_path / "q"), qcfg)
    expect = _greedy(_llm(_dequantized_twin(quant, str(tmp_path / "twin"))))
    llm = _llm(quant)
    methods = {type(m.quant_method).__name__ for m in _model(llm).modules()
               if hasattr(m, "quant_method") and "lm_head" not in m.prefix}
    assert methods == {"Fp8LinearMethod"}
    assert _greedy(llm) == expect


def test_prequantized_per_tensor_static_scaled_mm(float_ckpt, tmp_path, monkeypatch):
    """The static input_scale through torch._scaled_mm (forced on the CPU): close to the
    dequantized model."""
    qcfg = {"quant_method": "fp8", "activation_scheme": "static"}
    quant = _write_fp8_checkpoint(float_ckpt, str(tmp_path / "q"), qcfg)
    expect = _first_step(_llm(_dequantized_twin(quant, str(tmp_path / "twin"))))
    _force_scaled_mm(monkeypatch)
    llm = _llm(quant)
    scales = {m.fp8_input_scale.item() for m in _model(llm).modules()
              if getattr(m, "fp8_input_scale", None) is not None}
    assert len(scales) == 1 and scales.pop() == pytest.approx(0.02)
    _close_to_float(expect, _first_step(llm), tol=0.2)


def test_block_checkpoint_matches_transformers(float_ckpt, tmp_path):
    """transformers' block-scaled FP8 layout (weight_scale_inv per 32x32 block): Octavo's
    dequantized weights equal transformers' own dequantizing load, and so do the tokens."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    from tests.tiny_models import hf_greedy

    qcfg = {"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [32, 32], "fmt": "e4m3"}
    quant = _write_fp8_checkpoint(float_ckpt, str(tmp_path / "q"), qcfg, block=(32, 32))
    # dequantize=True: what transformers does without an fp8 GPU, asked for everywhere.
    hf = AutoModelForCausalLM.from_pretrained(
        quant, dtype=torch.float32, device_map="cpu",
        quantization_config=FineGrainedFP8Config(weight_block_size=(32, 32), dequantize=True))
    llm = _llm(quant)
    ours = _model(llm).model.layers[0]
    attn = hf.model.layers[0].self_attn
    theirs = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(ours.self_attn.qkv_proj.dequantized_weight, theirs.float())
    assert torch.equal(ours.mlp.down_proj.dequantized_weight,
                       hf.model.layers[0].mlp.down_proj.weight.float())
    prompts = [p["prompt_token_ids"] for p in PROMPTS]
    assert _greedy(llm) == hf_greedy(hf, prompts, GREEDY.max_tokens)


def test_wrong_checkpoint_is_an_error(float_ckpt, tmp_path):
    gptq = str(tmp_path / "gptq")
    shutil.copytree(float_ckpt, gptq)
    path = os.path.join(gptq, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    with open(path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="quantization='fp8' does not match the checkpoint, "
                                         "which declares quant_method='gptq'"):
        _llm(gptq, quantization="fp8")
    with pytest.raises(ValueError, match="fp8 activation_scheme='per-token' is not supported"):
        fp8.Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "per-token"})


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp8", "fp8-per-channel"])
def test_online_fp8_on_cuda(float_ckpt, name):
    """On a GPU of compute capability >= 8.9: weights stay fp8 and go through
    torch._scaled_mm; the first step stays close to the float model's."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need compute capability 8.9")
    expect = _first_step(_llm(float_ckpt, device="cuda"))
    llm = _llm(float_ckpt, quantization=name, device="cuda")
    buffers = {n.rsplit(".", 1)[-1] for n, _ in _model(llm).named_buffers()}
    assert "weight_fp8" in buffers and "dequantized_weight" not in buffers
    _close_to_float(expect, _first_step(llm), tol=0.15)
