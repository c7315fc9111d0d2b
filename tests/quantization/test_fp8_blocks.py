"""Dense layers of block-scaled FP8 checkpoints kept in FP8 (``OCTAVO_FP8_BLOCK_KEPT``, on
by default on CUDA 8.9+; forced here with the kernels in Triton's CPU interpreter): the weights stay one byte
each with their block scales, 1-2 rows run the FP8 GEMV's block mode, larger batches the
block GEMM, the largest dequantize per call, and the greedy tokens are the dequantized
twin's (float32)."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.quantization import fp8
from tests.quantization.test_fp8 import _dequantized_twin, _write_fp8_checkpoint
from tests.tiny_models import make_checkpoint

pytest.importorskip("triton")

BLOCK = (32, 32)  # the tiny qwen2's q / k / v parts (64 / 32 / 32 rows) start on block edges
QCFG = {"quant_method": "fp8", "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK), "fmt": "e4m3"}
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * n) % 500 for i in range(n)]} for n in (1, 6, 13)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8blocks")
    src = make_checkpoint("qwen2", str(root / "src"))
    quant = _write_fp8_checkpoint(src, str(root / "q"), QCFG, block=BLOCK)
    return quant, _dequantized_twin(quant, str(root / "twin"), block=BLOCK)


def _llm(path: str) -> LLM:
    return LLM(model=path, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
               device="cpu")


def _greedy(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _count(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(a[0].shape[0]) or
                        real(*a, **kw))
    return calls


# About a minute on CI's 2 cores under the Triton interpreter (session 58: 58-67 s, the
# slowest test of the suite); the GPU test below runs the same path on the device.
@pytest.mark.slow
def test_kept_blocks_give_the_twins_tokens(pair, monkeypatch):
    from octavo.kernels import fp8_block_gemm

    quant, twin = pair
    expect = _greedy(_llm(twin))
    single = _greedy(_llm(twin), PROMPTS[1:2])
    monkeypatch.setattr(fp8, "blocks_kept_dense", lambda device, k: True)
    monkeypatch.setenv("OCTAVO_FP8_BLOCK_GEMM_MAX_M", "8")
    gemv = _count(monkeypatch, fp8_block_gemm, "fp8_block_gemv")
    gemm = _count(monkeypatch, fp8_block_gemm, "fp8_block_gemm")
    dense = _count(monkeypatch, fp8, "dequantize_blocks")
    llm = _llm(quant)
    layer = llm.llm_engine.executor.worker.runner.model.model.layers[0]
    for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                layer.mlp.down_proj):
        assert lin.weight_fp8.dtype == fp8.FP8 and getattr(lin, "dequantized_weight",
                                                           None) is None
        assert tuple(lin.weight_block_scale.shape) == (-(-lin.weight_fp8.shape[0] // 32),
                                                       lin.weight_fp8.shape[1] // 32)
    assert _greedy(llm) == expect
    assert _greedy(llm, PROMPTS[1:2]) == single
    # Decode of one sequence: the GEMV (its gate/up with the activation in its store);
    # prefills of 6 and 13 tokens and decode of three sequences: the GEMM up to 8 rows,
    # dequantized above.
    assert 1 in gemv and set(gemm) >= {3, 6} and 13 not in gemm and dense


def test_off_the_gpu_or_turned_off_blocks_dequantize_at_load(pair, monkeypatch):
    assert not fp8.blocks_kept_dense(torch.device("cpu"), 64)
    monkeypatch.setenv("OCTAVO_FP8_BLOCK_KEPT", "0")
    assert not fp8.blocks_kept_dense(torch.device("cuda"), 64)
    llm = _llm(pair[0])
    qkv = llm.llm_engine.executor.worker.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.dequantized_weight.dtype == torch.float32
    assert getattr(qkv, "weight_block_scale", None) is None


def test_slices_off_the_blocks_dequantize(tmp_path, monkeypatch):
    """64-row blocks: k and v (32 rows each) do not start on a block edge, so the qkv layer
    dequantizes at load; layers whose parts do keep their blocks."""
    src = make_checkpoint("qwen2", str(tmp_path / "src"))
    qcfg = {**QCFG, "weight_block_size": [64, 32]}
    quant = _write_fp8_checkpoint(src, str(tmp_path / "q"), qcfg, block=(64, 32))
    monkeypatch.setattr(fp8, "blocks_kept_dense", lambda device, k: True)
    layer = _llm(quant).llm_engine.executor.worker.runner.model.model.layers[0]
    assert layer.self_attn.qkv_proj.dequantized_weight is not None
    assert layer.mlp.down_proj.weight_fp8.dtype == fp8.FP8


@pytest.mark.gpu
def test_on_the_gpu_kept_blocks_give_the_dequantized_tokens(pair, monkeypatch):
    """On CUDA (8.9+), float32: the kept blocks' kernels give the tokens of the layers
    dequantized at load (OCTAVO_FP8_BLOCK_KEPT=0)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FP8_BLOCK_KEPT", flag)
        llm = LLM(model=pair[0], dtype="float32", skip_tokenizer_init=True, max_model_len=64)
        qkv = llm.llm_engine.executor.worker.runner.model.model.layers[0].self_attn.qkv_proj
        assert (getattr(qkv, "weight_block_scale", None) is not None) == (flag == "1")
        runs[flag] = _greedy(llm)
        llm.llm_engine.shutdown()
    assert runs["1"] == runs["0"]


def test_blocks_the_kernels_cannot_step_through_dequantize(tmp_path, monkeypatch):
    """48-column blocks: no power-of-two K step fits them, so every layer dequantizes at
    load (and the tokens are the twin's)."""
    src = make_checkpoint("qwen2", str(tmp_path / "src"))
    qcfg = {**QCFG, "weight_block_size": [32, 48]}
    quant = _write_fp8_checkpoint(src, str(tmp_path / "q"), qcfg, block=(32, 48))
    twin = _dequantized_twin(quant, str(tmp_path / "twin"), block=(32, 48))
    monkeypatch.setattr(fp8, "blocks_kept_dense", lambda device, k: True)
    llm = _llm(quant)
    layer = llm.llm_engine.executor.worker.runner.model.model.layers[0]
    assert layer.mlp.down_proj.dequantized_weight is not None
    assert _greedy(llm) == _greedy(_llm(twin))


@pytest.mark.gpu
def test_on_the_gpu_bf16_batches_run_w8a8_close_to_the_dequantized_layers(pair, monkeypatch):
    """bfloat16 on sm_90: prefills and batches of 3+ rows take ``block_scaled_mm`` (W8A8 on
    the FP8 tensor cores), and the prompts' logprobs stay within FP8 activation rounding of
    the layers dequantized at load."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from octavo.kernels import fp8_block_gemm

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("OCTAVO_FP8_BLOCK_KEPT", flag)
        calls = _count(monkeypatch, fp8_block_gemm, "block_scaled_mm")
        llm = LLM(model=pair[0], dtype="bfloat16", skip_tokenizer_init=True, max_model_len=64)
        outs = llm.generate(PROMPTS[1:], params, use_tqdm=False)
        runs[flag] = [lp for o in outs for d in o.prompt_logprobs[1:] for lp in
                      (v.logprob for v in d.values())]
        llm.llm_engine.shutdown()
        assert bool(calls) == (flag == "1")
    diffs = [abs(a - b) for a, b in zip(runs["0"], runs["1"])]
    assert len(diffs) == len(runs["0"]) > 10 and max(diffs) < 0.25 and sum(diffs) / len(diffs) < 0.05
