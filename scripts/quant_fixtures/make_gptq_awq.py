"""Write the GPTQ / AWQ "format truth" fixtures: tiny random Llama / Qwen2 / Qwen3 checkpoints
quantized by GPTQModel itself, each with the greedy tokens and logprobs that transformers
produces when it loads the same checkpoint through GPTQModel's kernels (float32, CPU).

The tests (tests/quantization/test_real_gptq_awq.py) need only Octavo and the files this writes
under tests/fixtures/gptq_awq/<name>/. Running this needs GPTQModel, which pins a newer torch
than the CPU build here; a separate venv holds it (see issue 12, "What runs on this CPU")::

    python3 -m venv /work/venvs/gptqm && . /work/venvs/gptqm/bin/activate
    pip install torch==2.13.0
    pip install -r <gptqmodel 7.7 requirements.txt without its torch line> optimum
    pip install --no-deps gptqmodel==7.7.0
    GPTQMODEL_CPU_WORKERS=2 PYTHONPATH=. python scripts/quant_fixtures/make_gptq_awq.py

``--only NAME`` (repeatable) rebuilds some fixtures; ``--reference-only`` recomputes the
references of existing checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from scripts.quant_fixtures.gptqmodel_reference import load_reference_model, to_float32_math  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "gptq_awq")
VOCAB = 256
SPECIALS = ("<unk>", "<s>", "</s>")

# Odd shapes: hidden 96 (three groups of 32), intermediate 160 (five), GQA everywhere, Qwen3's
# head_dim making q_proj 128 wide (not the hidden size). initializer_range 0.1 so that the random
# models' greedy paths wander instead of repeating one token.
SHAPES = {
    "llama": dict(hidden_size=96, intermediate_size=160, num_attention_heads=6,
                  num_key_value_heads=2, vocab_size=VOCAB, initializer_range=0.1),
    "qwen2": dict(hidden_size=96, intermediate_size=160, num_attention_heads=3,
                  num_key_value_heads=1, vocab_size=VOCAB, initializer_range=0.1),
    "qwen3": dict(hidden_size=96, intermediate_size=160, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, initializer_range=0.1),
}
# GPTQModel's AWQ clip search takes output channels in batches of 64: every linear's output
# must be a multiple of 64 (hidden 128, intermediate 192 = six groups of 32, k/v 64 wide).
AWQ_SHAPES = {
    "llama": dict(SHAPES["llama"], hidden_size=128, intermediate_size=192,
                  num_attention_heads=4, num_key_value_heads=2),
    "qwen2": dict(SHAPES["qwen2"], hidden_size=128, intermediate_size=192,
                  num_attention_heads=2, num_key_value_heads=1),
    "qwen3": dict(SHAPES["qwen3"], hidden_size=128, intermediate_size=192),
}

# name: (family, GPTQModel QuantizeConfig keywords)
FIXTURES: dict[str, tuple[str, dict]] = {
    "llama-gptq4-g32": ("llama", dict(bits=4, group_size=32, desc_act=False, sym=True)),
    "llama-gptq4-g32-actorder": ("llama", dict(bits=4, group_size=32, desc_act=True, sym=True)),
    "qwen2-gptq4-g32-asym-actorder": ("qwen2", dict(bits=4, group_size=32, desc_act=True,
                                                    sym=False)),
    # GPTQModel's group-aware reordering (on by default without desc_act) needs groups.
    "qwen3-gptq4-gall": ("qwen3", dict(bits=4, group_size=-1, desc_act=False, sym=True,
                                       act_group_aware=False)),
    "qwen3-gptq4-g32-v2-asym": ("qwen3", dict(bits=4, group_size=32, desc_act=False, sym=False,
                                              format="gptq_v2")),
    "llama-gptq8-g32": ("llama", dict(bits=8, group_size=32, desc_act=False, sym=True)),
    "qwen2-gptq8-gall-actorder": ("qwen2", dict(bits=8, group_size=-1, desc_act=True,
                                                sym=True)),
    # GPTQModel's lm_head=True: the LM head quantized too (lm_head.qweight..., at 8 bits by
    # the "dynamic" rule GPTQModel adds for it). GPTQModel refuses to quantize the head of a
    # model with tied embeddings, so the Qwen3 one is untied (UNTIED).
    "llama-gptq4-g32-lmhead": ("llama", dict(bits=4, group_size=32, desc_act=False, sym=True,
                                             lm_head=True)),
    "qwen3-gptq4-g32-lmhead": ("qwen3", dict(bits=4, group_size=32, desc_act=False, sym=True,
                                             lm_head=True)),
    "llama-awq-g32": ("llama", dict(bits=4, group_size=32, method="awq", format="gemm",
                                    sym=False)),
    "qwen2-awq-g32": ("qwen2", dict(bits=4, group_size=32, method="awq", format="gemm",
                                    sym=False)),
    "qwen3-awq-g32-sym": ("qwen3", dict(bits=4, group_size=32, method="awq", format="gemm",
                                        sym=True)),
}

# Fixtures whose source model unties the family's tied embeddings.
UNTIED = {"qwen3-gptq4-g32-lmhead"}

# Token-id prompts (no tokenizer needed by the tests): lengths 1, 7 and 19.
PROMPTS = [[(37 * i + 11 * n) % (VOCAB - len(SPECIALS)) + len(SPECIALS) for i in range(n)]
           for n in (1, 7, 19)]
MAX_NEW_TOKENS = 12


def add_word_tokenizer(folder: str) -> None:
    """A whitespace word-level tokenizer: "w17" is token 17 (GPTQModel wants a tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<unk>").save_pretrained(folder)


def calibration(n: int = 24, length: int = 64, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(len(SPECIALS), VOCAB, (length,), generator=g).tolist(),
             "attention_mask": [1] * length} for _ in range(n)]


def quantize(src: str, out: str, qkwargs: dict) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig

    model = GPTQModel.load(src, QuantizeConfig(**qkwargs), device="cpu")
    model.quantize(calibration(), batch_size=4)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save(out)
    # Not part of the checkpoint: GPTQModel's per-module log.
    for name in ("quant_log.csv",):
        path = os.path.join(out, name)
        if os.path.exists(path):
            os.remove(path)


@torch.no_grad()
def greedy_with_logprobs(model, prompt: list[int], steps: int) -> tuple[list[int], list[float],
                                                                         list[float]]:
    """Greedy tokens, their logprobs, and the margin (top-1 minus top-2 logprob) of each step,
    recomputing the whole sequence each step (no cache: nothing but the model's math)."""
    ids = list(prompt)
    tokens, logprobs, margins = [], [], []
    for _ in range(steps):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        lp = torch.log_softmax(logits, dim=-1)
        top = torch.topk(lp, 2)
        tok = int(top.indices[0])
        tokens.append(tok)
        logprobs.append(float(top.values[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(tok)
    return tokens, logprobs, margins


def check_quantized_lm_head(folder: str, model) -> dict:
    """That the checkpoint's LM head is really quantized and the reference multiplies by it:
    lm_head.qweight... stored and no lm_head.weight, GPTQModel's quantized linear in the
    reference model (not transformers' random or tied float head)."""
    from safetensors import safe_open

    names = set()
    for file in os.listdir(folder):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), framework="pt") as f:
                names.update(f.keys())
    stored = sorted(n for n in names if n.startswith("lm_head."))
    if "lm_head.qweight" not in names or "lm_head.weight" in names:
        raise RuntimeError(f"{folder}: the LM head is not quantized in the checkpoint: {stored}")
    head = model.lm_head
    if not type(head).__module__.startswith("gptqmodel.nn_modules.qlinear"):
        raise RuntimeError(f"{folder}: the reference's LM head is {type(head).__name__}")
    return {"stored": stored, "kernel": type(head).__name__, "bits": head.bits,
            "group_size": head.group_size}


def write_reference(folder: str, name: str, family: str, qkwargs: dict) -> dict:
    import gptqmodel
    import transformers

    method = qkwargs.get("method", "gptq")
    model = load_reference_model(folder, method)
    kernel_run = greedy_with_logprobs(model, PROMPTS[-1], MAX_NEW_TOKENS)
    kernels = to_float32_math(model, method)
    runs = [greedy_with_logprobs(model, p, MAX_NEW_TOKENS) for p in PROMPTS]
    # How far the kernels' own float16 math is from the float32 reference (for the record).
    kernel_diff = max(abs(a - b) for a, b in zip(kernel_run[1], runs[-1][1]))
    ref = {
        "name": name, "family": family, "method": method, "quantize_config": qkwargs,
        "made_by": f"gptqmodel {gptqmodel.__version__}, transformers {transformers.__version__},"
                   f" torch {torch.__version__}",
        "reference": "transformers AutoModelForCausalLM, float32, CPU; quantized layers: "
                     + ", ".join(kernels) + ", dequantized by GPTQModel in float32",
        "kernel_float16_tokens_agree": kernel_run[0] == runs[-1][0],
        "kernel_float16_max_logprob_diff": kernel_diff,
        "prompts": PROMPTS,
        "tokens": [r[0] for r in runs],
        "logprobs": [r[1] for r in runs],
        "margins": [r[2] for r in runs],
    }
    if qkwargs.get("lm_head"):
        ref["lm_head"] = check_quantized_lm_head(folder, model)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    return ref


def build(name: str, reference_only: bool) -> None:
    family, qkwargs = FIXTURES[name]
    out = os.path.join(OUT_DIR, name)
    if not reference_only:
        with tempfile.TemporaryDirectory() as tmp:
            shapes = (AWQ_SHAPES if qkwargs.get("method") == "awq" else SHAPES)[family]
            if name in UNTIED:
                shapes = dict(shapes, tie_word_embeddings=False)
            src = make_checkpoint(family, os.path.join(tmp, "src"), seed=len(name), **shapes)
            add_word_tokenizer(src)
            quantize(src, out, qkwargs)
    ref = write_reference(out, name, family, qkwargs)
    print(f"{name}: {ref['tokens']}, min margin "
          f"{min(min(m) for m in ref['margins']):.4f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(FIXTURES))
    ap.add_argument("--reference-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    for name in args.only or FIXTURES:
        build(name, args.reference_only)


if __name__ == "__main__":
    main()
