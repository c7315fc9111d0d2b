"""Write the mixture-of-experts "format truth" fixtures: tiny random Qwen3-MoE / Qwen2-MoE /
Mixtral checkpoints whose experts were quantized by the tools themselves (GPTQModel: GPTQ and
AWQ; llm-compressor: compressed-tensors W4A16), each with the greedy tokens, logprobs and
margins that transformers produces when it loads the same checkpoint (float32, CPU).

The tests (tests/quantization/test_real_quantized_moe.py) need only Octavo and the files this
writes under tests/fixtures/moe/<name>/. Each tool has its own venv (see make_gptq_awq.py and
make_compressed_tensors.py); run this script in each, it builds the cases of the tool it finds::

    GPTQMODEL_CPU_WORKERS=2 PYTHONPATH=. /work/venvs/gptqm/bin/python \\
        scripts/quant_fixtures/make_moe.py
    PYTHONPATH=. /work/venvs/llmc/bin/python scripts/quant_fixtures/make_moe.py
    PYTHONPATH=. /work/venvs/bnb/bin/python scripts/quant_fixtures/make_moe.py

(the bitsandbytes venv as make_bitsandbytes.py's). GPTQModel leaves per-run logs under
./logs/, which are not part of the fixtures.

References: GPTQ / AWQ as make_gptq_awq.py (GPTQModel's torch kernels switched to its own
dequantization in float32); compressed-tensors as transformers decompresses the checkpoint on
load (compressed-tensors' own unpacking). Both check that the reference really holds the
checkpoint's quantized experts: as many GPTQModel quantized linears as the checkpoint has
``qweight`` modules, or a load with no missing / unexpected tensors.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from scripts.quant_fixtures.make_gptq_awq import (  # noqa: E402
    MAX_NEW_TOKENS,
    PROMPTS,
    VOCAB,
    add_word_tokenizer,
    greedy_with_logprobs,
)
from tests.tiny_models import make_checkpoint  # noqa: E402

OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "moe")

# 8 experts, 2 a token, expert width 64 (two groups of 32); hidden 128 (GPTQModel's AWQ clip
# search takes output channels 64 at a time); GQA. Qwen2-MoE: a shared expert 128 wide.
COMMON = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, initializer_range=0.1, num_hidden_layers=2)
SHAPES = {
    "qwen3_moe": dict(COMMON, head_dim=32, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=64, mlp_only_layers=[], norm_topk_prob=True),
    "qwen2_moe": dict(COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128, decoder_sparse_step=1),
    "mixtral": dict(COMMON, num_local_experts=8, num_experts_per_tok=2, intermediate_size=64),
}

# name: (family, tool, settings): GPTQModel QuantizeConfig keywords, or llm-compressor's
# (modifier, weights scheme)
CASES: dict[str, tuple[str, str, dict]] = {
    "qwen3_moe-gptq4-g32": ("qwen3_moe", "gptqmodel", dict(bits=4, group_size=32,
                                                           desc_act=False, sym=True)),
    "qwen2_moe-gptq4-g32-actorder-asym": ("qwen2_moe", "gptqmodel", dict(
        bits=4, group_size=32, desc_act=True, sym=False)),
    "mixtral-gptq4-g32-v2": ("mixtral", "gptqmodel", dict(bits=4, group_size=32,
                                                          desc_act=False, sym=True,
                                                          format="gptq_v2")),
    "qwen3_moe-awq-g32": ("qwen3_moe", "gptqmodel", dict(bits=4, group_size=32, method="awq",
                                                         format="gemm", sym=False)),
    "qwen3_moe-w4a16-g32-sym": ("qwen3_moe", "llmcompressor", dict(
        modifier="rtn", weights=dict(num_bits=4, type="int", symmetric=True,
                                     strategy="group", group_size=32))),
    # GPTQModifier: every expert sees calibration tokens here (8 experts, 2 a token).
    "mixtral-w4a16-g32-sym-gptq": ("mixtral", "llmcompressor", dict(
        modifier="gptq", weights=dict(num_bits=4, type="int", symmetric=True,
                                      strategy="group", group_size=32))),
    "qwen2_moe-w8a16-channel": ("qwen2_moe", "llmcompressor", dict(
        modifier="rtn", weights=dict(num_bits=8, type="int", symmetric=True,
                                     strategy="channel"))),
    # FP8 weights only: with dynamic FP8 activations (W8A8) transformers 5.17 decompresses
    # the experts into its fused float experts and runs them on unquantized activations, so
    # its tokens are not those of the checkpoint's scheme (they part from a W8A8 run at the
    # 7th token of the first prompt): no reference for that here.
    "qwen3_moe-fp8-w8a16-channel": ("qwen3_moe", "llmcompressor", dict(
        modifier="rtn", weights=dict(num_bits=8, type="float", symmetric=True,
                                     strategy="channel"))),
    # transformers 5's bitsandbytes leaves the experts (3-D parameters, not nn.Linear) in
    # float and quantizes the attention: smaller shapes, the experts are stored float32.
    "qwen3_moe-bnb-int8": ("qwen3_moe", "bitsandbytes", dict(load_in_8bit=True)),
    "qwen2_moe-bnb-nf4": ("qwen2_moe", "bitsandbytes", dict(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype="float32")),
}
SMALL = dict(hidden_size=64, moe_intermediate_size=32, num_experts=4,
             shared_expert_intermediate_size=64)


def _checkpoint_names(folder: str) -> list[str]:
    from safetensors import safe_open

    names = []
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), framework="pt") as f:
                names.extend(f.keys())
    return names


def _gptqmodel_quantize(src: str, out: str, qkwargs: dict) -> None:
    from scripts.quant_fixtures.make_gptq_awq import quantize

    quantize(src, out, qkwargs)


def _gptqmodel_reference(folder: str, qkwargs: dict) -> tuple[object, dict]:
    from scripts.quant_fixtures.gptqmodel_reference import load_reference_model, to_float32_math

    method = qkwargs.get("method", "gptq")
    quantized = sorted({n.rsplit(".", 1)[0] for n in _checkpoint_names(folder)
                        if n.endswith(".qweight")})
    model = load_reference_model(folder, method)
    kept_float = _restore_float_linears(model, folder, set(quantized))
    kernels = to_float32_math(model, method)
    qlinears = [n for n, m in model.named_modules()
                if type(m).__module__.startswith("gptqmodel.nn_modules.qlinear")]
    if sorted(qlinears) != quantized:
        raise RuntimeError(f"{folder}: the reference's quantized linears {len(qlinears)} are not "
                           f"the checkpoint's {len(quantized)}: "
                           f"{sorted(set(qlinears) ^ set(quantized))[:6]}")
    return model, {"method": method, "reference": "transformers AutoModelForCausalLM, float32, "
                   "CPU; quantized layers: " + ", ".join(kernels)
                   + ", dequantized by GPTQModel in float32"
                   + (f"; {kept_float} restored to the checkpoint's float weights"
                      if kept_float else ""),
                   "quantized_modules": len(quantized)}


def _restore_float_linears(model, folder: str, quantized: set[str]) -> list[str]:
    """transformers' GPTQ loading swaps every linear of a decoder layer for a quantized one
    (the checkpoint's ``modules_in_block_to_quantize`` is not consulted): a linear that
    GPTQModel left in float (Qwen2-MoE's ``shared_expert_gate``) comes back random, its float
    ``weight`` reported unexpected. Put such a layer back as an ``nn.Linear`` holding the
    checkpoint's own float tensors; the names, for the record."""
    from safetensors import safe_open

    tensors = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), framework="pt") as f:
                tensors.update({k: f.get_tensor(k) for k in f.keys()})
    restored = []
    for name, module in list(model.named_modules()):
        if (not type(module).__module__.startswith("gptqmodel.nn_modules.qlinear")
                or name in quantized or f"{name}.weight" not in tensors):
            continue
        w = tensors[f"{name}.weight"].float()
        bias = tensors.get(f"{name}.bias")
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
        with torch.no_grad():
            linear.weight.copy_(w)
            if bias is not None:
                linear.bias.copy_(bias.float())
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, linear)
        restored.append(name)
    return restored


def _llmc_quantize(src: str, out: str, settings: dict) -> None:
    from scripts.quant_fixtures.make_compressed_tensors import quantize

    groups = {"group_0": {"targets": ["Linear"], "weights": settings["weights"]}}
    # The routers are left in float by llm-compressor itself (it lists them in ignore).
    quantize(src, out, settings["modifier"], groups, ["lm_head"], VOCAB)


def _legacy_mixtral_copy(folder: str, tmp: str) -> str:
    """llm-compressor 0.14 saves Mixtral's experts as
    ``block_sparse_moe.experts.3.gate_proj`` / ``up_proj`` / ``down_proj``, which
    transformers 5.17 does not read back (its Mixtral conversion wants ``w1`` / ``w3`` /
    ``w2`` there: the load report lists every expert tensor UNEXPECTED and
    ``mlp.experts.gate_up_proj`` / ``down_proj`` MISSING). A copy with those three names
    renamed, tensors untouched, is what the reference loads."""
    from safetensors.torch import load_file, save_file

    names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    os.makedirs(tmp, exist_ok=True)
    for file in os.listdir(folder):
        path = os.path.join(folder, file)
        if not file.endswith(".safetensors"):
            shutil.copy(path, tmp)
            continue
        state = {}
        for k, v in load_file(path).items():
            for old, new in names.items():
                if ".block_sparse_moe.experts." in k and f".{old}." in k:
                    k = k.replace(f".{old}.", f".{new}.")
            state[k] = v
        save_file(state, os.path.join(tmp, file), metadata={"format": "pt"})
    return tmp


def _llmc_reference(folder: str, settings: dict) -> tuple[object, dict]:
    from transformers import AutoModelForCausalLM

    with open(os.path.join(folder, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    path = folder
    if arch == "MixtralForCausalLM":
        path = _legacy_mixtral_copy(folder, tempfile.mkdtemp())
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"{folder}: transformers did not load the checkpoint cleanly: {bad}")
    with open(os.path.join(folder, "config.json")) as f:
        ignore = json.load(f)["quantization_config"]["ignore"]
    quantized = {n.rsplit(".", 1)[0] for n in _checkpoint_names(folder)
                 if n.endswith(".weight_scale")}
    # transformers 5.17 decompresses FP8 experts to bfloat16 whatever the dtype asked
    # (integrations/compressed_tensors.py: ``(quant * scale).to(torch.bfloat16)``): recorded,
    # so that the test allows for that rounding.
    rounded = sorted(n for n, p in model.named_parameters() if p.dtype == torch.bfloat16)
    return model.eval(), {"method": "compressed-tensors",
                          "reference": "transformers AutoModelForCausalLM, float32, CPU; the "
                                       "checkpoint decompressed by compressed-tensors on load",
                          "quantized_modules": len(quantized), "ignore": ignore,
                          "reference_bfloat16": rounded}


def _bnb_quantize(src: str, out: str, settings: dict) -> None:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    cfg = dict(settings)
    if "bnb_4bit_compute_dtype" in cfg:
        cfg["bnb_4bit_compute_dtype"] = getattr(torch, cfg["bnb_4bit_compute_dtype"])
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, device_map="cpu",
                                                 quantization_config=BitsAndBytesConfig(**cfg))
    model.save_pretrained(out, safe_serialization=True)
    for name in os.listdir(src):  # tokenizer files
        if "token" in name and not os.path.exists(os.path.join(out, name)):
            shutil.copy(os.path.join(src, name), out)


def _bnb_reference(folder: str, settings: dict) -> tuple[object, dict]:
    """The saved checkpoint reloaded by transformers, each bitsandbytes layer a float Linear
    holding the weight bitsandbytes dequantizes its saved tensors to (the weight-only
    numerics Octavo runs; make_bitsandbytes.py's "saved_weight_only")."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    from scripts.quant_fixtures.make_bitsandbytes import dense_from_file, dequantized_twin

    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                       device_map="cpu",
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"{folder}: transformers did not load the checkpoint cleanly: {bad}")
    names = _checkpoint_names(folder)
    quantized = sorted(n for n, m in model.named_modules()
                       if isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)))
    experts_float = not any(".experts." in n and n.endswith((".SCB", ".absmax"))
                            for n in names)
    model = dequantized_twin(model, dense_from_file(folder))
    return model.eval(), {"method": "bitsandbytes",
                          "reference": "transformers AutoModelForCausalLM over the saved "
                                       "checkpoint, float32, CPU; each bitsandbytes layer a "
                                       "float Linear of the weight bitsandbytes dequantizes",
                          "quantized_modules": len(quantized), "experts_float": experts_float,
                          "reference_bfloat16": []}


TOOLS = {"gptqmodel": ("gptqmodel", _gptqmodel_quantize, _gptqmodel_reference),
         "llmcompressor": ("llmcompressor", _llmc_quantize, _llmc_reference),
         "bitsandbytes": ("bitsandbytes", _bnb_quantize, _bnb_reference)}


def _versions(tool: str) -> str:
    import transformers

    module = __import__(TOOLS[tool][0])
    return (f"{tool} {getattr(module, '__version__', '?')}, transformers "
            f"{transformers.__version__}, torch {torch.__version__}")


def build(name: str, reference_only: bool) -> None:
    family, tool, settings = CASES[name]
    _, quantize, reference = TOOLS[tool]
    out = os.path.join(OUT_DIR, name)
    if not reference_only:
        with tempfile.TemporaryDirectory() as tmp:
            shapes = dict(SHAPES[family])
            if tool == "bitsandbytes":
                shapes.update({k: v for k, v in SMALL.items() if k in shapes})
            src = make_checkpoint(family, os.path.join(tmp, "src"), seed=len(name), **shapes)
            add_word_tokenizer(src)
            if os.path.isdir(out):
                shutil.rmtree(out)
            quantize(src, out, settings)
            for extra in ("quant_log.csv",):  # GPTQModel's per-module log
                if os.path.exists(os.path.join(out, extra)):
                    os.remove(os.path.join(out, extra))
    model, meta = reference(out, settings)
    runs = [greedy_with_logprobs(model, p, MAX_NEW_TOKENS) for p in PROMPTS]
    ref = {"name": name, "family": family, "tool": tool, "settings": settings,
           "made_by": _versions(tool), **meta, "prompts": PROMPTS,
           "tokens": [r[0] for r in runs], "logprobs": [r[1] for r in runs],
           "margins": [r[2] for r in runs]}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{name}: {ref['tokens']}, min margin {min(min(m) for m in ref['margins']):.4f}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    ap.add_argument("--reference-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    # bitsandbytes sits beside llm-compressor or GPTQModel in no venv of these: its own.
    here = [n for n in CASES if importlib.util.find_spec(TOOLS[CASES[n][1]][0]) is not None]
    names = args.only or here
    if len(names) == 1:
        build(names[0], args.reference_only)
        return
    # One process per case: GPTQModel patches transformers' MoE classes (defuser) when it
    # loads a model, and a later case's source checkpoint, saved in the same process, then
    # comes out in a layout GPTQModel's loader refuses ("LazyTurtle: ... could not be
    # reshaped into the target layout").
    for name in names:
        extra = ["--reference-only"] if args.reference_only else []
        subprocess.run([sys.executable, os.path.abspath(__file__), "--only", name, *extra],
                       check=True)


if __name__ == "__main__":
    main()
