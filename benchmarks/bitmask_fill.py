"""Host cost of a structured-output step's bitmask (issue 16): 32 JSON-schema matchers fed
random allowed tokens for 128 steps (as a model with dummy weights produces), the time to fill
the 32 bitmask rows per step, by xgrammar thread count; with --torch-burst also right after a
burst of torch CPU ops (whose OpenMP threads spin a while after each op).

    python benchmarks/bitmask_fill.py [--tokenizer FOLDER] [--threads 1 2 4 8]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402
from benchmarks.structured_overhead import SCHEMA  # noqa: E402
from octavo.sample.grammar_mask import unpack_bitmask  # noqa: E402
from octavo.structured_output.params import StructuredOutputsParams  # noqa: E402
from octavo.structured_output.xgrammar_backend import XgrammarBackend  # noqa: E402


def load_tokenizer(folder: str | None):
    if folder:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    from octavo.default_model import default_model_path
    from octavo.model_loader.gguf_file import open_gguf

    return open_gguf(default_model_path()).load_tokenizer()


def run(tokenizer, threads: int, rows: int, steps: int, torch_burst: bool) -> dict:
    backend = XgrammarBackend(tokenizer, vocab_size=len(tokenizer),
                              stop_token_ids=[tokenizer.eos_token_id], max_threads=threads)
    compiled = backend.compile(StructuredOutputsParams(json=SCHEMA))
    matchers = [backend.new_matcher(compiled) for _ in range(rows)]
    rng = random.Random(0)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    fills = []
    for _ in range(steps):
        if torch_burst:
            for _ in range(20):
                a = torch.tanh(a @ b)
        t0 = time.perf_counter()
        bitmask = backend.allocate_bitmask(rows)
        backend.fill_bitmask(matchers, bitmask)
        fills.append(time.perf_counter() - t0)
        allowed = unpack_bitmask(bitmask, backend.vocab_size)
        for i, m in enumerate(matchers):
            ids = [t for t in allowed[i].nonzero().flatten().tolist()
                   if t != tokenizer.eos_token_id]
            assert m.accept_token(rng.choice(ids))
    fills.sort()
    return {"threads": threads, "torch_burst": torch_burst,
            "mean_ms": 1e3 * sum(fills) / len(fills), "p50_ms": 1e3 * fills[len(fills) // 2],
            "p90_ms": 1e3 * fills[int(len(fills) * 0.9)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=None, help="default: the embedded SmolLM2's")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--torch-burst", action="store_true",
                    help="also time each fill right after torch CPU ops")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    results = []
    for threads in args.threads:
        for burst in (False, True) if args.torch_burst else (False,):
            r = run(tokenizer, threads, args.rows, args.steps, burst)
            results.append(r)
            print(f"threads {threads}  after torch ops {str(burst):5}  fill {args.rows} rows: "
                  f"mean {r['mean_ms']:.3f} ms  p50 {r['p50_ms']:.3f}  p90 {r['p90_ms']:.3f}")
    print_json_result({"benchmark": "bitmask fill", "commit": git_commit(),
                       "device": device_info(), "torch_threads": torch.get_num_threads(),
                       "vocab": len(tokenizer), "rows": args.rows, "results": results},
                      args.json)


if __name__ == "__main__":
    main()
