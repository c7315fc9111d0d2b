"""Where a decode step's time goes on the GPU: torch.profiler over a few decode steps of a
W1-like batch, with and without CUDA graphs.

    python benchmarks/profile_step.py [--batch 256] [--context 1000] [--eager]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import write_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from octavo import LLM, SamplingParams

    llm = LLM(model=write_config("qwen3-0.6b"), load_format="dummy", dtype="bfloat16",
              skip_tokenizer_init=True, max_model_len=4096, max_num_seqs=args.batch,
              enforce_eager=args.eager)
    engine = llm.llm_engine
    runner = engine.executor.worker.runner
    print("graphs:", None if runner.graph_runner is None else runner.graph_runner.sizes)
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=args.steps + 8)
    for i in range(args.batch):
        engine.add_request(str(i), {"prompt_token_ids": [i % 1000 + 1] * args.context}, params)
    while engine.timings.decode_steps < 4:  # prefill, then a few decodes to warm up
        engine.step()
    engine.timings.reset()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(f"batch {args.batch} context {args.context} eager={args.eager}: "
          f"{1e3 * wall / args.steps:.2f} ms/step (profiled)")
    print(json.dumps(engine.timings.summary()))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    main()
