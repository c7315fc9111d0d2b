"""W7 shared prefix (../shared/BENCHMARKS.md): requests = one shared prefix + a few unique
tokens; throughput with automatic prefix caching on and off, in the same call, and the
prefix-cache hit rate.

    python benchmarks/shared_prefix.py                       # full W7 (GPU-sized)
    python benchmarks/shared_prefix.py --num-requests 32 --prefix-len 512 --output-len 32
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(model, prompts, output_len, caching: bool, dtype: str, load_format: str) -> dict:
    from octavo import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, load_format=load_format, skip_tokenizer_init=True,
              enable_prefix_caching=caching, max_model_len=max(len(p) for p in prompts)
              + output_len + 16)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                 use_tqdm=False)
    kv = llm.llm_engine.scheduler.kv
    q0, h0 = kv.prefix_queries, kv.prefix_hits
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    queries, hits = kv.prefix_queries - q0, kv.prefix_hits - h0
    result = {"prefix_caching": caching, "wall_s": wall, "output_tokens": n_out,
              "output_tok_s": n_out / wall,
              "total_tok_s": (n_out + sum(len(p) for p in prompts)) / wall,
              "hit_rate": hits / queries if queries else 0.0,
              "token_ids": [o.outputs[0].token_ids for o in outs]}
    del llm
    gc.collect()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="folder or .gguf (default: embedded model)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--unique-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    from benchmarks.common import device_info, git_commit
    from octavo.default_model import default_model_path

    model = args.model or default_model_path()
    rng = random.Random(0)
    prefix = [rng.randrange(100, 10000) for _ in range(args.prefix_len)]
    prompts = [prefix + [rng.randrange(100, 10000) for _ in range(args.unique_len)]
               for _ in range(args.num_requests)]
    print(f"W7 shared prefix: {args.num_requests} requests x ({args.prefix_len} shared + "
          f"{args.unique_len} unique) tokens, {args.output_len} output tokens; commit "
          f"{git_commit()}")
    off = run(model, prompts, args.output_len, False, args.dtype, args.load_format)
    on = run(model, prompts, args.output_len, True, args.dtype, args.load_format)
    same = sum(a == b for a, b in zip(on.pop("token_ids"), off.pop("token_ids")))
    for r in (off, on):
        print(f"prefix caching {'on ' if r['prefix_caching'] else 'off'}: "
              f"{r['output_tok_s']:8.1f} output tok/s, {r['total_tok_s']:9.1f} total tok/s, "
              f"{r['wall_s']:.2f} s, hit rate {r['hit_rate']:.1%}")
    ratio = on["output_tok_s"] / off["output_tok_s"]
    print(f"speed-up with prefix caching: {ratio:.2f}x; identical greedy outputs: "
          f"{same}/{len(prompts)}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"workload": "W7", "device": device_info(), "commit": git_commit(),
                       "date": time.strftime("%Y-%m-%d"), "args": vars(args),
                       "runs": [off, on], "speedup": ratio, "identical": same}, f, indent=2)


if __name__ == "__main__":
    main()
