"""Per-step cost of one request's logits processing (octavo.sample.logits_processors) for the
fields whose work scales with the request rather than the batch: a vocabulary-sized
``allowed_token_ids`` or ``logit_bias``, and the repetition penalty over a long prompt. Each
is timed with the request's ``RowCache`` kept across steps (what the worker does) and rebuilt
every step (what it did before c43e47d), on the CPU or the GPU: the median step.

    python benchmarks/logits_processing.py [--vocab 49152] [--prompt 131072] [--steps 20]
        [--device cpu]

Prints a line per case and one RESULT_JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def cases(vocab: int) -> dict:
    from octavo import SamplingParams

    return {
        "allowed_token_ids (whole vocabulary)": SamplingParams(
            allowed_token_ids=list(range(vocab))),
        "logit_bias (whole vocabulary)": SamplingParams(
            logit_bias={i: 1.0 for i in range(vocab)}),
        "repetition_penalty (long prompt)": SamplingParams(repetition_penalty=1.1),
    }


def per_step_ms(params, prompt: list[int], vocab: int, steps: int, keep: bool,
                device) -> float:
    """The median of ``steps`` steps' milliseconds (the first steps after a big allocation
    stall on the allocator and page faults, so a mean would time those)."""
    import torch

    from octavo.sample.logits_processors import RowCache, RowContext, apply_logits_processors

    logits = torch.randn(1, vocab, device=device)
    cache = RowCache() if keep else None
    output = [1]
    times = []
    for i in range(steps):
        output = output + [(7 * i) % vocab]  # a token a step, as decode appends them
        start = time.perf_counter()
        apply_logits_processors(logits, [RowContext(0, params, prompt, output, cache=cache)])
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=131072, help="prompt tokens")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    prompt = [i % args.vocab for i in range(args.prompt)]
    results = []
    for name, params in cases(args.vocab).items():
        kept = per_step_ms(params, prompt, args.vocab, args.steps, True, device)
        rebuilt = per_step_ms(params, prompt, args.vocab, args.steps, False, device)
        results.append({"case": name, "kept_ms": round(kept, 4),
                        "rebuilt_ms": round(rebuilt, 4)})
        print(f"{name}: {kept:.3f} ms a step kept, {rebuilt:.3f} rebuilt every step")
    print("RESULT_JSON " + json.dumps({"vocab": args.vocab, "prompt": args.prompt,
                                       "device": str(device), "results": results}))


if __name__ == "__main__":
    main()
