"""Batch-1 decode of llama.cpp's own GGUF files on this CPU: Octavo against llama.cpp, the same
file, alternated in one run.

    python benchmarks/gguf_cpu.py --model A.gguf [--model B.gguf ...] \
        --llama-bench PATH [--rounds 3] [--tokens 64] [--json-out F]

For each file, Octavo loads it once (GGUF blocks kept, the CPU default); then each round times
Octavo (``moe_cpu.octavo_decode``'s measure: (tokens - 1) / (time of a ``tokens`` request -
time of a 1-token one), best of ``--repeat``) and right after it llama.cpp's ``llama-bench -p 0
-n TOKENS`` (its decode-only test, ``-r REPEAT``), so both see the same machine load; the
ratio is taken per round and the median reported. Both use all of this machine's cores unless
``--threads``. The real files of MODELS.md (Qwen2.5-Coder-0.5B / 1.5B Instruct, Q4_K_M) are
what a llama.cpp user runs; llama-bench is built from the llama.cpp source vendored in
llama-cpp-python's source archive (``cmake --build build --target llama-bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import cpu_count, device_info, git_commit, print_json_result  # noqa: E402


def octavo_rounds(llm, prompt: int, tokens: int, repeat: int):
    """A function timing one round of Octavo's batch-1 decode on a loaded ``llm``: one request
    of ``prompt`` random token ids, greedy, EOS ignored; decode tok/s = (tokens - 1) / (time
    of a ``tokens`` request - time of a 1-token one), each the best of ``repeat``."""
    from octavo import SamplingParams

    rng = random.Random(0)
    ids = [rng.randrange(100, 30000) for _ in range(prompt)]

    def timed(n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == n
        return time.perf_counter() - t0

    timed(tokens)  # warm-up

    def one_round() -> dict:
        first = min(timed(1) for _ in range(repeat))
        whole = min(timed(tokens) for _ in range(repeat))
        return {"prefill_s": first, "request_s": whole,
                "decode_tok_s": (tokens - 1) / (whole - first)}

    return one_round


def llama_decode(binary: str, path: str, tokens: int, threads: int, repeat: int) -> dict:
    """llama.cpp's decode-only test (``llama-bench -p 0 -n tokens``) on ``path``."""
    cmd = [binary, "-m", path, "-p", "0", "-n", str(tokens), "-t", str(threads),
           "-r", str(repeat), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout)
    tg = next(r for r in rows if r.get("n_gen") == tokens)
    return {"decode_tok_s": tg["avg_ts"], "stddev_tok_s": tg.get("stddev_ts"),
            "build": tg.get("build_commit"), "command": " ".join(cmd)}


def bench_file(path: str, args, threads: int) -> dict:
    from octavo import LLM

    t0 = time.perf_counter()
    llm = LLM(model=path, device="cpu", skip_tokenizer_init=True, max_model_len=2048)
    load_s = time.perf_counter() - t0
    one_round = octavo_rounds(llm, args.prompt, args.tokens, args.repeat)
    rounds = []
    for r in range(args.rounds):
        octavo = one_round()["decode_tok_s"]
        row = {"octavo_tok_s": octavo}
        if args.llama_bench:
            peer = llama_decode(args.llama_bench, path, args.tokens, threads, args.repeat)
            row.update(llama_cpp_tok_s=peer["decode_tok_s"], ratio=octavo / peer["decode_tok_s"],
                       llama_cpp_build=peer["build"])
        rounds.append(row)
        print(f"  round {r + 1}: " + ", ".join(
            f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    out = {"file": os.path.basename(path), "file_bytes": os.path.getsize(path),
           "octavo_load_s": load_s, "rounds": rounds,
           "octavo_tok_s_median": statistics.median(r["octavo_tok_s"] for r in rounds)}
    if args.llama_bench:
        out["llama_cpp_tok_s_median"] = statistics.median(r["llama_cpp_tok_s"] for r in rounds)
        out["ratio_median"] = statistics.median(r["ratio"] for r in rounds)
    del llm
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, help="a GGUF file (repeatable)")
    ap.add_argument("--llama-bench", default=None, help="path to llama.cpp's llama-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    threads = args.threads or cpu_count()
    import torch

    torch.set_num_threads(threads)
    result = {"benchmark": "GGUF batch-1 decode on the CPU against llama.cpp, alternated",
              "threads": threads, "device": device_info(), "commit": git_commit(),
              "date": time.strftime("%Y-%m-%d"), "prompt": args.prompt, "tokens": args.tokens,
              "files": []}
    for path in args.model:
        print(f"{os.path.basename(path)}:", flush=True)
        result["files"].append(bench_file(path, args, threads))
    print_json_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
