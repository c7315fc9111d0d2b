"""Quantize a real model with GPTQModel, for the perplexity table (docs/quantization.md).

Two steps, both run in the GPTQModel venv (see make_gptq_awq.py)::

    # a GGUF (e.g. the embedded SmolLM2) as a float safetensors checkpoint transformers wrote
    python scripts/quant_fixtures/quantize_real.py float --gguf PATH --out /tmp/smollm2-float
    # GPTQ / AWQ of it, calibrated on calibration_text.txt (not the text perplexity is measured on)
    python scripts/quant_fixtures/quantize_real.py quantize --src /tmp/smollm2-float \\
        --out /tmp/smollm2-gptq4-g64 --method gptq --bits 4 --group-size 64

Group size 128 does not divide SmolLM2's hidden size (576): use 64 or 32 there.
"""

from __future__ import annotations

import argparse
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CALIBRATION = os.path.join(HERE, "calibration_text.txt")


def gguf_to_float(gguf: str, out: str, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                  dtype=getattr(torch, dtype))
    # transformers refuses to save a GGUF-loaded model: move its (dequantized) weights into a
    # plain one built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def calibration(src: str, length: int, stride: int) -> list[dict]:
    """Overlapping windows of the calibration text, tokenized by the model's tokenizer."""
    from transformers import AutoTokenizer

    with open(CALIBRATION) as f:
        ids = AutoTokenizer.from_pretrained(src)(f.read(), add_special_tokens=False)["input_ids"]
    starts = range(0, max(1, len(ids) - length + 1), stride)
    return [{"input_ids": ids[s: s + length], "attention_mask": [1] * len(ids[s: s + length])}
            for s in starts]


def quantize(src: str, out: str, method: str, bits: int, group_size: int, desc_act: bool,
             sym: bool) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig

    kwargs = dict(bits=bits, group_size=group_size, sym=sym)
    if method == "awq":
        kwargs.update(method="awq", format="gemm")
    else:
        kwargs.update(desc_act=desc_act)
    model = GPTQModel.load(src, QuantizeConfig(**kwargs), device="cpu")
    model.quantize(calibration(src, 128, 32), batch_size=4)
    model.save(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("float")
    f.add_argument("--gguf", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--dtype", default="float32")
    q = sub.add_parser("quantize")
    q.add_argument("--src", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--method", choices=("gptq", "awq"), default="gptq")
    q.add_argument("--bits", type=int, default=4)
    q.add_argument("--group-size", type=int, default=64)
    q.add_argument("--desc-act", action="store_true")
    q.add_argument("--asym", action="store_true", help="sym=False (AWQ: zero points)")
    args = ap.parse_args()
    if args.cmd == "float":
        gguf_to_float(args.gguf, args.out, args.dtype)
    else:
        quantize(args.src, args.out, args.method, args.bits, args.group_size, args.desc_act,
                 not args.asym)


if __name__ == "__main__":
    main()
