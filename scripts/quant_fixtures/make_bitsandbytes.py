"""Write the bitsandbytes fixtures of tests/quantization/test_bitsandbytes.py with the real tools.

Run in a virtual environment holding bitsandbytes, transformers and accelerate (they are not
Octavo dependencies), from the repository root:

    python3 -m venv /work/venvs/bnb
    /work/venvs/bnb/bin/pip install torch==2.13.0 bitsandbytes transformers accelerate
    PYTHONPATH=. /work/venvs/bnb/bin/python scripts/quant_fixtures/make_bitsandbytes.py

For each tiny random family (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms and tied
embeddings, all with GQA) it writes under tests/fixtures/bitsandbytes/:

- ``<family>-bf16/``: the unquantized checkpoint, stored in bfloat16 (small), for the
  quantize-at-load path;
- ``<family>-<variant>/``: that checkpoint loaded by transformers with a ``BitsAndBytesConfig``
  (8-bit; 4-bit NF4 with and without double quantization; 4-bit FP4 for Llama) on the CPU, then
  saved with ``save_pretrained``: bitsandbytes' own serialized tensors and quantization_config;
- ``bnb_direct.safetensors``: bitsandbytes' quantizers applied directly to two Llama weights
  (int8 + SCB; NF4, NF4 double-quantized, FP4 packed weights and absmax), what quantizing at
  load must reproduce;
- ``bnb_module_float32.safetensors``: a float32 weight and the int8 + SCB bitsandbytes'
  ``Linear8bitLt`` quantizes it to at load (it casts to float16 first); alone with
  ``--module-float32-only``;
- ``reference.json``: per variant, transformers' greedy tokens and their logprobs (float32
  compute) from the model quantized at load ("online"), from the saved checkpoint reloaded
  ("saved"), and from the online model with every bitsandbytes layer replaced by a float
  Linear holding the weight bitsandbytes dequantizes it to ("weight_only": the numerics Octavo
  runs; bitsandbytes itself multiplies int8 activations with an outlier split at
  ``llm_int8_threshold`` for 8-bit, and uses its own single-token 4-bit GEMV kernel).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.getcwd())
from tests.tiny_models import make_checkpoint  # noqa: E402

OUT = os.path.join("tests", "fixtures", "bitsandbytes")
PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (1, 6, 13)]
MAX_NEW = 8
# Smaller vocabulary than the other tiny models: the fixtures are committed.
OVERRIDES = {"vocab_size": 256}
VARIANTS = {
    "int8": dict(load_in_8bit=True),
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False,
                bnb_4bit_compute_dtype=torch.float32),
    "nf4-dq": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                   bnb_4bit_compute_dtype=torch.float32),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False,
                bnb_4bit_compute_dtype=torch.float32),
}
FAMILY_VARIANTS = {"llama": ["int8", "nf4", "nf4-dq", "fp4"], "qwen2": ["int8", "nf4-dq"],
                   "qwen3": ["int8", "nf4"]}


def greedy(model) -> dict:
    """Greedy tokens of each prompt and the logprob of each chosen token."""
    tokens, logprobs = [], []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
            toks = out.sequences[0, len(p):].tolist()
            lps = [torch.log_softmax(step[0].float(), -1)[t].item()
                   for step, t in zip(out.logits, toks)]
            tokens.append(toks)
            logprobs.append(lps)
    return {"tokens": tokens, "logprobs": logprobs}


def dense_in_memory(name: str, module) -> torch.Tensor:
    """The weight bitsandbytes dequantizes a quantized layer of a live model to."""
    import bitsandbytes as bnb

    w = module.weight
    if isinstance(module, bnb.nn.Linear8bitLt):
        scb = w.SCB if w.SCB is not None else module.state.SCB
        return torch.ops.bitsandbytes.int8_vectorwise_dequant.default(w.data, scb)
    return bnb.functional.dequantize_4bit(w.data, w.quant_state)


def dense_from_file(folder: str):
    """The weight bitsandbytes dequantizes a layer's saved tensors to, read from the file
    (a 2-D float absmax, transformers 5's [in / blocksize, out], put back in block order)."""
    import bitsandbytes.functional as bf
    from safetensors.torch import load_file

    state = load_file(os.path.join(folder, "model.safetensors"))

    def dense(name: str, module) -> torch.Tensor:
        key = name + ".weight"
        if name + ".SCB" in state:
            return torch.ops.bitsandbytes.int8_vectorwise_dequant.default(state[key],
                                                                          state[name + ".SCB"])
        qs = {k[len(key) + 1:]: v for k, v in state.items() if k.startswith(key + ".")}
        if qs["absmax"].dim() == 2:
            qs["absmax"] = qs["absmax"].t().reshape(-1).float()
        return bf.dequantize_4bit(state[key], bf.QuantState.from_dict(qs, device="cpu"))
    return dense


def dequantized_twin(model, dense_of):
    """``model`` with each bitsandbytes layer replaced by a float Linear holding
    ``dense_of(name, layer)``: the weight-only numerics in plain float32 matmuls."""
    import bitsandbytes as bnb

    for name, module in list(model.named_modules()):
        if isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)):
            lin = torch.nn.Linear(module.in_features, module.out_features,
                                  bias=module.bias is not None)
            lin.weight.data = dense_of(name, module).float()
            if module.bias is not None:
                lin.bias.data = module.bias.data.float()
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, lin)
    return model


def direct_quantization(src: str) -> dict[str, torch.Tensor]:
    """bitsandbytes' own quantizers applied to two float32 weights of the Llama source (q_proj:
    one 64-block a row; down_proj: two), what its modules compute when quantizing at load."""
    import bitsandbytes.functional as bf
    from safetensors.torch import load_file

    state = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        w = state[name].float()
        q, scb, _ = torch.ops.bitsandbytes.int8_vectorwise_quant.default(w)
        out[f"int8/{name}"], out[f"int8/{name}.SCB"] = q, scb
        for variant, quant_type, nested in (("nf4", "nf4", False), ("nf4-dq", "nf4", True),
                                            ("fp4", "fp4", False)):
            packed, qs = bf.quantize_4bit(w, blocksize=64, quant_type=quant_type,
                                          compress_statistics=nested)
            out[f"{variant}/{name}"], out[f"{variant}/{name}.absmax"] = packed, qs.absmax
            if nested:
                out[f"{variant}/{name}.nested_absmax"] = qs.state2.absmax
                out[f"{variant}/{name}.nested_offset"] = qs.offset.reshape(1)
    return out


def module_quantization_float32() -> dict[str, torch.Tensor]:
    """A float32 weight (values not representable in float16) and the int8 + SCB a
    ``Linear8bitLt`` holds once its ``Int8Params`` is moved to the CPU: what transformers'
    ``BitsAndBytesConfig(load_in_8bit=True)`` does to a float32 checkpoint. bitsandbytes casts
    the weight to float16 before quantizing it (``Int8Params._quantize``); the bfloat16 weights
    of the other fixtures pass that cast unchanged, a float32 checkpoint's do not."""
    import bitsandbytes as bnb

    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 128, generator=g) * 0.05
    layer = bnb.nn.Linear8bitLt(128, 16, bias=False, has_fp16_weights=False)
    layer.weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False)
    layer = layer.to("cpu")
    return {"weight": w, "int8": layer.weight.data.clone(), "SCB": layer.weight.SCB.clone()}


def shrink(path: str) -> None:
    """Store the float32 tensors bitsandbytes did not make (embeddings, norms, biases, LM
    head) in bfloat16: they come from the bfloat16 source, so nothing is lost."""
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    for name, t in state.items():
        own = name.endswith((".SCB", ".absmax", ".quant_map", ".nested_absmax",
                             ".nested_quant_map"))
        if t.dtype == torch.float32 and not own:
            assert torch.equal(t.to(torch.bfloat16).float(), t), name
            state[name] = t.to(torch.bfloat16)
    save_file(state, path, metadata={"format": "pt"})


def main() -> None:
    import bitsandbytes as bnb
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    module_file = os.path.join(OUT, "bnb_module_float32.safetensors")
    if "--module-float32-only" in sys.argv:  # just that file (the rest takes minutes)
        save_file(module_quantization_float32(), module_file)
        return
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    save_file(module_quantization_float32(), module_file)
    ref = {"prompts": PROMPTS, "max_new_tokens": MAX_NEW,
           "versions": {"bitsandbytes": bnb.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__}, "cases": {}}
    for family, variants in FAMILY_VARIANTS.items():
        tmp = os.path.join(OUT, f"_{family}-fp32")
        make_checkpoint(family, tmp, seed=0, **OVERRIDES)
        src = os.path.join(OUT, f"{family}-bf16")
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16)
        model.save_pretrained(src, safe_serialization=True)
        shutil.rmtree(tmp)
        float_model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        ref["cases"][f"{family}-bf16"] = {"float": greedy(float_model)}
        if family == "llama":
            save_file(direct_quantization(src), os.path.join(OUT, "bnb_direct.safetensors"))
        for variant in variants:
            quantized = functools.partial(
                AutoModelForCausalLM.from_pretrained, src, dtype=torch.float32,
                device_map="cpu", quantization_config=BitsAndBytesConfig(**VARIANTS[variant]))
            model = quantized()
            case = {"online": greedy(model),
                    # A fresh model: save_pretrained below changes this one's quant state.
                    "weight_only": greedy(dequantized_twin(quantized(), dense_in_memory))}
            folder = os.path.join(OUT, f"{family}-{variant}")
            model.save_pretrained(folder, safe_serialization=True)
            reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                            device_map="cpu")
            # transformers 5 writes 4-bit weights requantized from the source dtype, and a
            # non-nested absmax as [in / blocksize, out], which its own reload reads flat.
            case["saved"] = greedy(reloaded)
            case["saved_weight_only"] = greedy(dequantized_twin(reloaded,
                                                                dense_from_file(folder)))
            ref["cases"][f"{family}-{variant}"] = case
            print(family, variant, {k: v["tokens"] for k, v in case.items()}, flush=True)
    for folder in os.listdir(OUT):  # tokenizer-free fixtures: keep what Octavo reads
        path = os.path.join(OUT, folder)
        if os.path.isdir(path):
            for name in os.listdir(path):
                if name not in ("config.json", "model.safetensors", "generation_config.json"):
                    os.remove(os.path.join(path, name))
            shrink(os.path.join(path, "model.safetensors"))
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


if __name__ == "__main__":
    main()
