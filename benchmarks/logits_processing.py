"""Per-step cost of logits processing (octavo.sample.logits_processors), the median step, on
the CPU or the GPU:

- one request with the fields whose work scales with the request rather than the batch (a
  vocabulary-sized ``allowed_token_ids`` or ``logit_bias``, the repetition penalty over a
  long prompt), its ``RowCache`` kept across steps (what the worker does) and rebuilt every
  step (what it did before c43e47d);
- ``--rows N``: the sampler's step over a batch of N rows that all ask for penalties
  (frequency, repetition, both with presence), each with its cache kept, as the worker runs
  it. Run it with another tree first on PYTHONPATH to compare commits.

    python benchmarks/logits_processing.py [--vocab 49152] [--prompt 131072] [--steps 20]
        [--device cpu] [--rows 256 --batch-vocab 151936 --batch-prompt 1000 --output 2000]

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


def batch_step_ms(rows: int, vocab: int, prompt: int, output: int, steps: int,
                  device) -> dict[str, float]:
    """The sampler's step (logits processing, then greedy) over ``rows`` rows of one kind of
    penalty each case, the rows' caches kept across steps; median milliseconds a step."""
    import torch

    from octavo import SamplingParams
    from octavo.sample import logits_processors as lp
    from octavo.sample.metadata import SamplingMetadata
    from octavo.sample.sampler import Sampler

    kinds = {"frequency": SamplingParams(frequency_penalty=0.5, temperature=0),
             "repetition": SamplingParams(repetition_penalty=1.1, temperature=0),
             "repetition+frequency+presence": SamplingParams(
                 frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1,
                 temperature=0)}
    out = {}
    for name, params in kinds.items():
        seqs = [[(r + i) % vocab for i in range(prompt)]
                + [(7 * i + r) % vocab for i in range(output)] for r in range(rows)]
        caches = [lp.RowCache() for _ in range(rows)]
        sampler, times = Sampler(), []
        for step in range(steps):
            for seq in seqs:
                seq.append(step % vocab)
            logits = torch.randn(rows, vocab, device=device)  # the step's own
            start = time.perf_counter()
            if hasattr(lp.RowContext, "over"):
                ctxs = [lp.RowContext.over(r, params, seqs[r], prompt, cache=caches[r])
                        for r in range(rows)]
            else:  # trees before the views: the worker sliced each row's lists
                ctxs = [lp.RowContext(r, params, seqs[r][:prompt], seqs[r][prompt:],
                                      cache=caches[r]) for r in range(rows)]
            sampler(logits, SamplingMetadata(True, None, None, None, None, {}, None, ctxs))
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[name] = round(statistics.median(times[1:]) * 1e3, 3)
        print(f"{rows} rows, {name}: {out[name]:.3f} ms a step")
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=131072, help="prompt tokens")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=0, help="also time a batch of this many rows")
    ap.add_argument("--batch-vocab", type=int, default=151936)
    ap.add_argument("--batch-prompt", type=int, default=1000)
    ap.add_argument("--output", type=int, default=2000)
    args = ap.parse_args()
    device = torch.device(args.device)
    batch = None
    if args.rows:
        batch = batch_step_ms(args.rows, args.batch_vocab, args.batch_prompt, args.output,
                              6, device)
    prompt = [i % args.vocab for i in range(args.prompt)]
    results = []
    for name, params in cases(args.vocab).items():
        kept = per_step_ms(params, prompt, args.vocab, args.steps, True, device)
        rebuilt = per_step_ms(params, prompt, args.vocab, args.steps, False, device)
        results.append({"case": name, "kept_ms": round(kept, 4),
                        "rebuilt_ms": round(rebuilt, 4)})
        print(f"{name}: {kept:.3f} ms a step kept, {rebuilt:.3f} rebuilt every step")
    print("RESULT_JSON " + json.dumps({"vocab": args.vocab, "prompt": args.prompt,
                                       "device": str(device), "results": results,
                                       "batch": batch and {"rows": args.rows, **batch}}))


if __name__ == "__main__":
    main()
