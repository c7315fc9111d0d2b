"""Where a generation makes the host wait for the device: every synchronizing CUDA operation
(torch's sync debug mode) of an offline run, counted by the Octavo source line that made it,
per engine step. One wait a step is the sampled tokens read back; any other stops the host
from preparing the next step while the device runs this one.

    python benchmarks/host_syncs.py                       # plain sampling
    python benchmarks/host_syncs.py --penalties --min-tokens 8 --logit-bias --n 2

Prints a table and, with --json, writes it. GPU only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import traceback
import warnings

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import write_config  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "octavo")


def _site() -> str:
    """The innermost Octavo frame of the current stack, as path:line (function)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if os.path.abspath(frame.filename).startswith(ROOT):
            rel = os.path.relpath(frame.filename, os.path.dirname(ROOT))
            return f"{rel}:{frame.lineno} ({frame.name})"
    return "(outside octavo)"


@contextlib.contextmanager
def counting_syncs(sites: collections.Counter):
    """Count every synchronizing CUDA operation inside the block into ``sites``, by the
    Octavo source line that made it (torch's sync debug mode, its warnings recorded)."""
    import torch

    def record(message, category, filename, lineno, file=None, line=None):
        sites[_site()] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(0)


def params(args):
    from octavo import SamplingParams

    extra = {}
    if args.penalties:
        extra.update(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1)
    if args.logit_bias:
        extra["logit_bias"] = {5: 1.0, 17: -2.0}
    return SamplingParams(temperature=0.6, max_tokens=args.output, ignore_eos=True,
                          min_tokens=args.min_tokens, n=args.n, **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--penalties", action="store_true")
    ap.add_argument("--logit-bias", action="store_true")
    ap.add_argument("--min-tokens", type=int, default=0)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from octavo import LLM, SamplingParams

    llm = LLM(model=write_config(args.shape), load_format="dummy", dtype="bfloat16",
              skip_tokenizer_init=True, max_model_len=4096, gpu_memory_utilization=0.85)
    prompts = [{"prompt_token_ids": [(i * 7 + j) % 5000 + 10 for j in range(args.prompt)]}
               for i in range(args.requests)]
    llm.generate(prompts[:4], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    engine = llm.llm_engine
    sites: collections.Counter = collections.Counter()
    steps = 0
    original_step = engine.step

    def counted_step():
        nonlocal steps
        steps += 1
        return original_step()

    engine.step = counted_step
    torch.cuda.synchronize()
    with counting_syncs(sites):
        llm.generate(prompts, params(args), use_tqdm=False)
    rows = [{"site": s, "syncs": c, "per_step": round(c / max(steps, 1), 3)}
            for s, c in sites.most_common()]
    print(f"{steps} engine steps, {sum(sites.values())} synchronizing operations")
    for r in rows:
        print(f"{r['per_step']:8.3f}/step {r['syncs']:6d}  {r['site']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "host_syncs", "args": vars(args), "steps": steps,
                       "sites": rows}, f, indent=1)


if __name__ == "__main__":
    main()
