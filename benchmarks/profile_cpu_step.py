"""Where a CPU decode step's time goes: W6's shape (the embedded SmolLM2-135M, float32 or with
``--dtype auto`` quantized, 32 requests) decoding at a given context, ms per step and a torch.profiler table of a few steps.

    python benchmarks/profile_cpu_step.py [--context 100] [--batch 32] [--steps 10] [--threads 1]

Run it with OCTAVO_CPU_KERNELS=0 for the torch ops the C++ kernels replace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=100, help="prompt tokens per request")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="decode steps timed")
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's)")
    ap.add_argument("--dtype", default="float32",
                    help='"auto": the GGUF weights kept quantized (the CPU default)')
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    if args.threads:
        torch.set_num_threads(args.threads)

    from octavo import LLM, SamplingParams
    from octavo.default_model import default_model_path

    llm = LLM(model=default_model_path(), dtype=args.dtype, max_num_seqs=args.batch)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, ignore_eos=True,
                            max_tokens=args.steps + args.profile_steps + 8)
    for i in range(args.batch):
        prompt = [(i * 7 + j) % 40000 + 10 for j in range(args.context)]
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    while engine.timings.decode_steps < 4:  # prefill, then a few decodes to warm up
        engine.step()
    engine.timings.reset()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    wall = time.perf_counter() - t0
    print(f"batch {args.batch}, context ~{args.context}: {1e3 * wall / args.steps:.1f} ms per "
          f"decode step")
    print(json.dumps(engine.timings.summary()))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            engine.step()
    print(f"profile of {args.profile_steps} steps (totals over all of them):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20,
                                    max_name_column_width=50))
    engine.abort_request([str(i) for i in range(args.batch)])


if __name__ == "__main__":
    main()
