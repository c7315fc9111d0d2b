"""Quantize a real float checkpoint with llm-compressor, for the perplexity tables
(docs/quantization.md): compressed-tensors W4A16 (GPTQ, group), W8A16 (round to nearest, one
scale per output channel) and AWQ (AWQ smoothing, then W4A16 asymmetric, group).

Run in the llm-compressor venv (see make_compressed_tensors.py), on a float checkpoint written
by ``quantize_real.py float``::

    PYTHONPATH=. /work/venvs/llmc/bin/python scripts/quant_fixtures/quantize_llmc.py \\
        --src /tmp/smollm2-float --out /tmp/smollm2-ct-w4a16-g64 --scheme w4a16 --group-size 64

Calibration is the same as quantize_real.py's (windows of 128 tokens every 32 of
calibration_text.txt, not the text perplexity is measured on). The LM head (and, with tied
embeddings, the embedding) stays in float.

AWQ on a machine without an accelerator: llm-compressor pins the cached activations of each
layer before its grid search (``IntermediatesCache.pin_memory``), which needs an accelerator;
here that is made a no-op (pinning only speeds host-to-device copies, which do not happen).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quantize_real import calibration  # noqa: E402


def _weights(bits: int, strategy: str, symmetric: bool, group_size: int | None) -> dict:
    w = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
    if group_size is not None:
        w["group_size"] = group_size
    return w


def recipe(scheme: str, group_size: int):
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier

    ignore = ["lm_head"]
    if scheme == "w4a16":  # llm-compressor's W4A16 preset (GPTQ, symmetric), our group size
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": _weights(4, "group", True, group_size)}}
        return [GPTQModifier(config_groups=groups, ignore=ignore)]
    if scheme == "w4a16-rtn":  # the same scheme rounded to nearest (no calibration)
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": _weights(4, "group", True, group_size)}}
        return [QuantizationModifier(config_groups=groups, ignore=ignore)]
    if scheme == "w8a16":  # llm-compressor's W8A16 preset: int8, one scale per output channel
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": _weights(8, "channel", True, None)}}
        return [QuantizationModifier(config_groups=groups, ignore=ignore)]
    if scheme == "awq":  # llm-compressor's AWQ example: smoothing, then W4A16_ASYM
        from llmcompressor.modifiers.transform.awq import AWQModifier
        from llmcompressor.pipelines.cache import IntermediatesCache

        if not torch.accelerator.is_available():
            IntermediatesCache.pin_memory = lambda self, *a, **k: None
        groups = {"group_0": {"targets": ["Linear"],
                              "weights": _weights(4, "group", False, group_size)}}
        return [AWQModifier(), QuantizationModifier(config_groups=groups, ignore=ignore)]
    raise ValueError(f"unknown scheme {scheme!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="float checkpoint folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--scheme", choices=("w4a16", "w4a16-rtn", "w8a16", "awq"), required=True)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--samples", type=int, default=None, help="at most N calibration windows")
    args = ap.parse_args()

    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    rows = calibration(args.src, 128, 32)[: args.samples]
    data = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows],
                              "attention_mask": [r["attention_mask"] for r in rows]})
    model = AutoModelForCausalLM.from_pretrained(args.src, dtype=torch.float32)
    t0 = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe(args.scheme, args.group_size),
            num_calibration_samples=len(rows), max_seq_length=128)
    print(f"{args.scheme}: oneshot {time.perf_counter() - t0:.0f} s over {len(rows)} windows",
          flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    model.save_pretrained(args.out, save_compressed=True)
    for name in os.listdir(args.src):  # tokenizer files
        if ("token" in name or name.endswith(".jinja")) and \
                not os.path.exists(os.path.join(args.out, name)):
            shutil.copy(os.path.join(args.src, name), args.out)


if __name__ == "__main__":
    main()
