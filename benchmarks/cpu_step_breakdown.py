"""Where one CPU decode step's time goes, by thread CPU time: the W6 shape (the embedded
SmolLM2-135M, GGUF blocks kept by default, 32 requests) decoding at a given context, split into
the fused decoder stack (`gguf_decoder_layers`: GEMMs, attention, norms), the LM head
(`compute_logits`), the sampler and the rest (scheduling, input preparation, outputs).

    OMP_NUM_THREADS=1 python benchmarks/cpu_step_breakdown.py [--context 90] [--steps 30]

Thread CPU time (``time.thread_time``), not wall time: on a shared machine the time this
thread spends descheduled by other processes is not counted, so runs of two versions
alternated in the same window compare even when the machine is busy. Use one thread (with
more, the pool's threads' work is not on this thread's clock).
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wrap(owner, name: str, key: str, totals: dict[str, float]) -> None:
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        t = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.thread_time() - t

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=90,
                    help="prompt tokens per request (W6's decode contexts average ~110)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30, help="decode steps timed")
    ap.add_argument("--model", default=None, help="a GGUF file (default: the embedded model)")
    ap.add_argument("--dtype", default="auto",
                    help='"auto": the GGUF weights kept quantized (the CPU default)')
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from octavo import LLM, SamplingParams
    from octavo.default_model import default_model_path
    from octavo.models.cpu_fused_decode import FusedGGUFDecode
    from octavo.sample.sampler import Sampler

    llm = LLM(model=args.model or default_model_path(), dtype=args.dtype,
              max_num_seqs=args.batch)
    engine = llm.llm_engine
    totals: dict[str, float] = collections.defaultdict(float)
    # The in-process model (uni executor): the one module with compute_logits.
    model = next(o for o in gc.get_objects()
                 if isinstance(o, torch.nn.Module) and hasattr(o, "compute_logits"))
    _wrap(FusedGGUFDecode, "__call__", "decoder stack (fused)", totals)
    _wrap(model, "compute_logits", "LM head (compute_logits)", totals)
    _wrap(Sampler, "__call__", "sampler", totals)
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=args.steps + 8)
    for i in range(args.batch):
        prompt = [(i * 7 + j) % 40000 + 10 for j in range(args.context)]
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    while engine.timings.decode_steps < 4:  # prefill, then a few decodes to warm up
        engine.step()
    totals.clear()
    steps = []
    for _ in range(args.steps):
        t = time.thread_time()
        engine.step()
        steps.append(time.thread_time() - t)
    n = len(steps)
    print(f"batch {args.batch}, context {args.context + 4}-{args.context + 4 + n}: step median "
          f"{1e3 * statistics.median(steps):.1f} ms, mean {1e3 * sum(steps) / n:.1f} ms "
          "(thread CPU time)")
    for key, value in totals.items():
        print(f"  {key:26s} {1e3 * value / n:7.2f} ms")
    print(f"  {'rest':26s} {1e3 * (sum(steps) - sum(totals.values())) / n:7.2f} ms")
    engine.abort_request([str(i) for i in range(args.batch)])


if __name__ == "__main__":
    main()
