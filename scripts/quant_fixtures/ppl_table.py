"""Markdown rows of the perplexity tables in docs/quantization.md from benchmarks/perplexity.py
``--json`` results::

    python scripts/quant_fixtures/ppl_table.py BASE.json ROW.json ... [--out table.json]

BASE is the float32 row the deltas are against. Weight bytes are the decoder layers' tensors in
the checkpoint (``decoder_layer_bytes``); for a method quantized at load from a float checkpoint
they are computed from the format: ``--at-load`` NAME=METHOD tells which rows those are.
"""

from __future__ import annotations

import argparse
import json


def _bytes_at_load(base: dict, method: str) -> int | None:
    """Decoder-layer bytes as the method holds them on the GPU, from the float32 checkpoint's
    decoder bytes: every layer tensor is a linear weight but the norms (small: ignored here,
    the float rows count them), so bytes scale by bits per weight."""
    b = base.get("decoder_layer_bytes")
    if not b:
        return None
    weights = b / 4  # float32 checkpoint
    bits = {"bf16": 16, "bitsandbytes": 8, "fp8": 8, "fp8-per-channel": 8,
            # 4 bits + an 8-bit absmax code per 64 + a float32 absmax per 256 blocks
            "bitsandbytes-nf4": 4 + 8 / 64 + 32 / (64 * 256)}.get(method)
    if bits is None:
        return None
    return int(weights * bits / 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("rows", nargs="+", help="LABEL=PATH.json")
    ap.add_argument("--at-load", nargs="*", default=[], help="LABEL=METHOD")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with open(args.base) as f:
        base = json.load(f)
    at_load = dict(a.split("=", 1) for a in args.at_load)
    bf16 = base["decoder_layer_bytes"] / 2
    table = []
    for spec in args.rows:
        label, path = spec.split("=", 1)
        with open(path) as f:
            r = json.load(f)
        nbytes = (_bytes_at_load(base, at_load[label]) if label in at_load
                  else r.get("decoder_layer_bytes"))
        delta = r["perplexity"] / base["perplexity"] - 1
        peer = ("-" if "top1_agreement" not in r else
                f"{r['peer_perplexity']:.4f}; {100 * r['top1_agreement']:.2f}% / "
                f"{r['greedy_identical'].replace('/', ' of ')}; {r['max_logprob_diff']:.0e}")
        size = "-" if not nbytes else f"{nbytes / 2**20:.1f} MiB ({100 * nbytes / bf16:.1f}%)"
        print(f"| {label} | {r['perplexity']:.4f} | "
              f"{'-' if r is base else f'{100 * delta:+.2f}%'} | {size} | {peer} |")
        table.append({"label": label, **{k: r.get(k) for k in (
            "perplexity", "peer_perplexity", "top1_agreement", "greedy_identical",
            "max_logprob_diff", "text_tokens", "commit", "date", "model", "quantization",
            "dtype")}, "delta_vs_float32": round(delta, 6), "decoder_layer_bytes": nbytes})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
