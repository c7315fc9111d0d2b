"""W4 batch scaling (../shared/BENCHMARKS.md): fixed 128-token prompts, 256 output tokens, batch
sizes 1..256; output tok/s and mean time per output token per batch size.

    python benchmarks/latency.py [--shape qwen3-0.6b] [--batch-sizes 1,2,4,...] [--repeat N]

``--repeat N`` times each batch size N times (fresh prompts each) and reports the median (the
JSON keeps every sample): one timing of W4's batch 32 read 1.59-1.67 ms for the same code on
an H200, more than the effect of most single changes. To compare environment variants, run
``benchmarks/ab_latency.py``, which alternates them in separate processes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import write_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="timings per batch size (median)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    import torch

    from benchmarks.common import device_info, git_commit
    from octavo import LLM, SamplingParams

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    # W4's 128 + 256 tokens run under max_model_len 1024 as always; longer requests
    # (--prompt-len 4096: a long one-request context) get room for their whole length.
    max_model_len = max(1024, args.prompt_len + args.output_len)
    llm = LLM(model=write_config(args.shape), load_format="dummy", dtype="bfloat16",
              skip_tokenizer_init=True, max_model_len=max_model_len, max_num_seqs=max(sizes),
              enforce_eager=args.enforce_eager)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len)
    # Warm up every batch size: Triton specialises integer arguments (==1, %16==0), so the
    # first prefill at sizes 2 and 16 compiles a kernel; that must not land in the timing.
    for bs in sizes:
        warm = [{"prompt_token_ids": [rng.randrange(10000) for _ in range(args.prompt_len)]}
                for _ in range(bs)]
        llm.generate(warm, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    rows = []
    print(f"W4 batch scaling ({args.shape}, bf16, prompt {args.prompt_len}, output "
          f"{args.output_len}) commit {git_commit()}")
    for bs in sizes:
        samples = []
        for _ in range(args.repeat):
            prompts = [{"prompt_token_ids": [rng.randrange(10000)
                                             for _ in range(args.prompt_len)]}
                       for _ in range(bs)]
            sync()
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            sync()
            wall = time.perf_counter() - t0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            samples.append((wall, n))
        wall, n = sorted(samples)[len(samples) // 2]  # the median run (upper for even N)
        row = {"batch": bs, "output_tok_s": n / wall,
               "ms_per_output_token": 1e3 * wall / args.output_len,
               "samples_ms_per_output_token": [round(1e3 * w / args.output_len, 4)
                                               for w, _ in samples]}
        rows.append(row)
        spread = ""
        if args.repeat > 1:
            ms = row["samples_ms_per_output_token"]
            spread = f" (median of {args.repeat}: {min(ms):.3f}-{max(ms):.3f})"
        print(f"batch {bs:4d}: {row['output_tok_s']:10,.0f} tok/s, "
              f"{row['ms_per_output_token']:.3f} ms per output token (per sequence){spread}")
    base = rows[0]
    for r in rows:
        r["throughput_x_vs_batch1"] = r["output_tok_s"] / base["output_tok_s"]
        r["tpot_growth_vs_batch1"] = r["ms_per_output_token"] / base["ms_per_output_token"] - 1
    b32 = next((r for r in rows if r["batch"] == 32), None)
    if b32:
        print(f"batch 1 -> 32: {b32['throughput_x_vs_batch1']:.1f}x throughput, time per "
              f"output token {b32['tpot_growth_vs_batch1']:+.0%}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"workload": "W4", "device": device_info(), "commit": git_commit(),
                       "date": time.strftime("%Y-%m-%d"), "shape": args.shape,
                       "repeat": args.repeat,
                       "env": {k: v for k, v in os.environ.items() if k.startswith("OCTAVO_")},
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
