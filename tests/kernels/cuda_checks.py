"""Shared checks of the CUDA C++ kernels' tests (test_swapab_mma.py, test_dense_mma.py, the
swap-AB stores'): a source's text and the GPU tests' skip without a build, the opt-in switch,
one nvcc build with ptxas's spill report, and an engine's greedy decode compared step by step
with another's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module


def source_text(source: str) -> str:
    """The text of a CUDA source of ``octavo/kernels/cuda`` (``cuda_module.SOURCE_DIR``)."""
    return (Path(cuda_module.SOURCE_DIR) / source).read_text()


def needs_build(source: str):
    """Skips a test without a CUDA device or without ``source`` built for it (nvcc)."""
    return pytest.mark.skipif(not torch.cuda.is_available()
                              or cuda_module.module(source, torch.device("cuda")) is None,
                              reason="needs an NVIDIA GPU and nvcc")


def check_switch(monkeypatch, kernel, env: str, default: bool) -> None:
    """``kernel.available`` is False without a GPU or a build; with one (a module "built") it
    follows ``env`` (``default`` when unset)."""
    assert cuda_module.module(kernel.SOURCE, torch.device("cpu")) is None
    monkeypatch.setattr(cuda_module, "module", lambda source, device: object())  # "built"
    monkeypatch.delenv(env, raising=False)
    assert kernel.available(torch.device("cuda", 0)) == default
    monkeypatch.setenv(env, "0")
    assert not kernel.available(torch.device("cuda", 0))
    monkeypatch.setenv(env, "1")
    assert kernel.available(torch.device("cuda", 0))
    monkeypatch.setattr(cuda_module, "module", lambda source, device: None)  # no nvcc
    assert not kernel.available(torch.device("cuda", 0))


def build_once(source: str, names: list[str], tmp_path, monkeypatch) -> dict[str, int]:
    """``source`` built for sm_90 into ``tmp_path`` by one nvcc run (a second build is served
    from the cache without nvcc), every kernel of ``names`` in the cubin and no other:
    ptxas's spill-store bytes per kernel (its report kept from the build, nvcc -Xptxas -v)."""
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    runs = []
    real_run = subprocess.run

    def run(cmd, **kw):
        proc = real_run(cmd, **kw)
        runs.append((cmd, proc))
        return proc

    monkeypatch.setattr(cuda_module.subprocess, "run", run)
    cubin = cuda_module.build(source, "sm_90", extra=("-Xptxas", "-v"))
    data = cubin.read_bytes()
    assert cubin.parent == tmp_path / "cuda"
    for name in names:
        assert name.encode() in data, name
    builds = [proc for cmd, proc in runs if "-cubin" in cmd]
    assert len(builds) == 1
    assert cuda_module.build(source, "sm_90", extra=("-Xptxas", "-v")) == cubin
    assert len([cmd for cmd, _ in runs if "-cubin" in cmd]) == 1  # cached: no second build
    report = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores",
                        builds[0].stderr, re.S)
    assert sorted(name for name, _ in report) == sorted(names)
    return {name: int(spilled) for name, spilled in report}


PROMPTS = [{"prompt_token_ids": list(range(i, i + 20 + 3 * i))} for i in range(6)]


def count_rows(monkeypatch, module, name: str) -> list[int]:
    """``module.name`` (a kernel taking x [..., K] first) wrapped: the rows of each call."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda x, *a, **kw: calls.append(
        x.numel() // x.shape[-1]) or real(x, *a, **kw))
    return calls


def greedy_decode(model_dir, liven, enforce_eager: bool = True, prompts=None) -> list:
    """(token ids, the chosen tokens' logprobs) per prompt of ``prompts`` (PROMPTS), six
    greedy tokens each,
    from an engine on ``model_dir``'s config with dummy weights made lively by
    ``liven(model)``; the engine freed after."""
    import gc

    from octavo import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1, ignore_eos=True)
    llm = LLM(model=str(model_dir), load_format="dummy", dtype="bfloat16", seed=0,
              skip_tokenizer_init=True, max_model_len=256, gpu_memory_utilization=0.2,
              enforce_eager=enforce_eager)
    liven(llm.llm_engine.executor.worker.runner.model)
    outs = [o.outputs[0] for o in llm.generate(prompts or PROMPTS, params, use_tqdm=False)]
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [(list(o.token_ids), [lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)])
            for o in outs]


def compare_decodes(ref: list, got: list, first: int = 0, tol: float = 0.1) -> int:
    """The chosen tokens' logprobs agree within ``tol`` from token ``first`` on, step by step
    while the two agree on the token: the number of steps compared."""
    compared = 0
    for (r_ids, r_lp), (g_ids, g_lp) in zip(ref, got):
        for i in range(first, len(r_ids)):
            assert abs(g_lp[i] - r_lp[i]) < tol, (i, g_lp, r_lp)
            compared += 1
            if g_ids[i] != r_ids[i]:
                break
    return compared


# --- the mma's fragments, emulated on the CPU (test_dense_mma.py, test_swapab_mma.py) ----

LANE = np.arange(32)
G, T = LANE // 4, LANE % 4


def mma16816(d, a, b):
    """``mma.sync.m16n8k16.row.col`` of one warp on float64 operands, from the PTX ISA's
    fragment layouts (a register holds two consecutive values, the lower column / row first):
    A [16, 16] row-major: a0 (row g, cols 2t, 2t+1), a1 (row g+8, cols 2t, 2t+1),
    a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9); B [16, 8]: b0 (rows 2t, 2t+1,
    col g), b1 (rows 2t+8, 2t+9, col g); C / D [16, 8]: c0, c1 (row g, cols 2t, 2t+1),
    c2, c3 (row g+8, cols 2t, 2t+1). a: [32 lanes, 4 registers, 2], b: [32, 2, 2],
    d: [32, 4], accumulated in place."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for e in range(2):
        A[G, 2 * T + e] = a[:, 0, e]
        A[G + 8, 2 * T + e] = a[:, 1, e]
        A[G, 2 * T + 8 + e] = a[:, 2, e]
        A[G + 8, 2 * T + 8 + e] = a[:, 3, e]
        B[2 * T + e, G] = b[:, 0, e]
        B[2 * T + 8 + e, G] = b[:, 1, e]
    D = A @ B
    d[:, 0] += D[G, 2 * T]
    d[:, 1] += D[G, 2 * T + 1]
    d[:, 2] += D[G + 8, 2 * T]
    d[:, 3] += D[G + 8, 2 * T + 1]


def gptq_llama(model_dir, group_size: int) -> None:
    """A two-layer bf16 GPTQ 4-bit Llama config in ``model_dir`` (dummy weights; hidden 512,
    intermediate 1024: every projection 256-column aligned)."""
    import json

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                      "desc_act": False, "sym": True}}
    (model_dir / "config.json").write_text(json.dumps(config))


def liven_int(model) -> None:
    """Dummy weights (+-1e-3) give near-uniform logits, under which any kernel passes: the
    same seeded, larger scales, embeddings and LM head in every engine of a test. The scales
    are drawn in the layer's own column order and stored in its kernel's (an MLP weight in
    ``glu_blocked`` order included), so engines with other layouts hold the same model."""
    from octavo.kernels.w4a16_swapab import glu_blocked

    g = torch.Generator(device="cuda").manual_seed(1)
    for _name, mod in sorted(model.named_modules(), key=lambda nm: nm[0]):
        s = getattr(mod, "scales_kernel", None)
        if s is None:
            continue
        fresh = torch.empty_like(s).uniform_(0.01, 0.03, generator=g)
        block = getattr(mod, "glu_block", None)
        s.copy_(fresh[:, glu_blocked(s.shape[1], block, s.device)] if block else fresh)
    for name, p in sorted(model.named_parameters()):
        if "embed_tokens" in name:
            p.data.normal_(0.0, 1.0, generator=g)
        elif "lm_head" in name:
            p.data.normal_(0.0, 0.05, generator=g)


def check_switch_decodes(model_dir, monkeypatch, module, name: str, switch: str, used) -> None:
    """Greedy decodes of ``model_dir`` (``liven_int``) with the environment ``switch`` off,
    then on: no call of ``module.name`` takes the switched path off (``used(kwargs)``), some
    do on, and the two agree on the prefill's token and, step by step, on the logprobs."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda x, *a, **kw: calls.append(used(kw)) or
                        real(x, *a, **kw))

    def run(on: bool):
        monkeypatch.setenv(switch, "1" if on else "0")
        return greedy_decode(model_dir, liven_int)

    off = run(False)
    assert calls and not any(calls)
    calls.clear()
    on = run(True)
    assert any(calls)
    for (a, _), (b, _) in zip(off, on):
        assert a[0] == b[0]
    assert compare_decodes(off, on, first=1) >= 3 * len(PROMPTS)


def swapab_column(row: int, bits: int) -> int:
    """swapab_mma.cu's column<BITS> (4 or 8), read from the source: int16 row R's value 0
    (value v is 64 v further)."""
    from octavo.kernels import swapab_mma

    text = source_text(swapab_mma.SOURCE)
    m = re.search(r"return BITS == 4 \? \(row >> 6\) \* (\d+) \+ \(row & (\d+)\) : "
                  r"\(row >> 6\) \* (\d+) \+ \(row & (\d+)\)", text)
    assert m, "column<BITS> changed: update this transcription"
    mul, mask = (m.group(1), m.group(2)) if bits == 4 else (m.group(3), m.group(4))
    return (row >> 6) * int(mul) + (row & int(mask))
