"""W9: Octavo against llama.cpp (llama-cpp-python) on this CPU, the same GGUF file, same run.

Each engine runs in its own process, so its peak RSS (``ru_maxrss``: load, the runs, all of it)
is its own; neither imports the other's stack (the llama.cpp child never imports torch). The
parent gives both the same prompt token ids. Figures per engine:

- decode tok/s at batch 1: one chat prompt, greedy, ``max_tokens`` with EOS ignored, best of
  ``repeats`` after a warm-up (Octavo: the time of a ``max_tokens + 1`` run minus a 1-token one;
  llama.cpp: the eval loop after the prompt, one token at a time, argmax of its logits);
- TTFT of a 512-token prompt (prompt processing and the first token), best of ``repeats``;
- peak RSS; and for Octavo, W6 at batch 32 (all chat prompts in one generate call, tok/s).

llama-cpp-python is not a dependency: install it into its own folder (it builds llama.cpp from
source with CMake, minutes on 2 cores) and pass that folder::

    pip install --target /work/venvs/llamacpp-site llama-cpp-python==0.3.36
    python benchmarks/cpu_small.py --engines octavo --llamacpp /work/venvs/llamacpp-site

Run directly, this file is the child: ``--engine octavo|llamacpp --inputs IDS.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TTFT_TOKENS = 512


def _peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so
    a child started by a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _best(fn, repeats: int) -> float:
    return min(fn() for _ in range(repeats))


# ----------------------------------------------------------------------------- children


def child_octavo(model: str, chat: list[list[int]], long: list[int], max_tokens: int,
                 repeats: int, dtype: str) -> dict[str, Any]:
    sys.path.insert(0, REPO_ROOT)
    from octavo import LLM, SamplingParams

    t0 = time.perf_counter()
    # No prefix caching: the repeats of one prompt would otherwise hit it (llama.cpp is reset).
    llm = LLM(model=model, dtype=dtype, max_model_len=2048, enable_prefix_caching=False)
    load_s = time.perf_counter() - t0

    def timed(prompts: list[list[int]], n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return wall

    timed(chat[:1], 8)  # warm-up
    first = _best(lambda: timed(chat[:1], 1), repeats)
    full = _best(lambda: timed(chat[:1], max_tokens + 1), repeats)
    ttft = _best(lambda: timed([long], 1), repeats)
    w6_wall = timed(chat, max_tokens)
    quant = llm.llm_engine.config.quantization if hasattr(llm.llm_engine, "config") else None
    return {"engine": "octavo", "quantization": quant or f"none ({dtype})",
            "decode_tok_s_b1": max_tokens / (full - first), "ttft_512_s": ttft,
            "w6_tok_s": len(chat) * max_tokens / w6_wall, "w6_batch": len(chat),
            "load_s": load_s, "peak_rss_mib": _peak_rss_mib()}


def child_llamacpp(model: str, chat: list[list[int]], long: list[int], max_tokens: int,
                   repeats: int, threads: int) -> dict[str, Any]:
    import numpy as np
    from llama_cpp import Llama, __version__

    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                n_batch=512, verbose=False)
    load_s = time.perf_counter() - t0

    def last_argmax() -> int:
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))

    def decode(prompt: list[int], n: int) -> tuple[float, float]:
        """(seconds to the first token, seconds for the next n tokens)."""
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        tok = last_argmax()
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n):
            llm.eval([tok])
            tok = last_argmax()
        return ttft, time.perf_counter() - t

    decode(chat[0], 8)  # warm-up
    dec = _best(lambda: decode(chat[0], max_tokens)[1], repeats)
    ttft = _best(lambda: decode(long, 0)[0], repeats)
    return {"engine": "llama.cpp", "version": __version__, "quantization": "GGUF as stored",
            "decode_tok_s_b1": max_tokens / dec, "ttft_512_s": ttft, "load_s": load_s,
            "threads": threads, "peak_rss_mib": _peak_rss_mib()}


# ----------------------------------------------------------------------------- parent


def run_peers(model: str, chat: list[list[int]], long: list[int], max_tokens: int,
              llamacpp_site: str, threads: int = 2, repeats: int = 3,
              octavo_dtype: str = "auto") -> dict[str, Any]:
    """Both engines, one child process each (llama.cpp first: it is the shorter run)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"chat": chat, "long": long}, f)
        inputs = f.name
    results: dict[str, Any] = {}
    try:
        for engine in ("llamacpp", "octavo"):
            env = dict(os.environ)
            if engine == "llamacpp":
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (llamacpp_site, env.get("PYTHONPATH")) if p)
            cmd = [sys.executable, os.path.abspath(__file__), "--engine", engine, "--model",
                   model, "--inputs", inputs, "--max-tokens", str(max_tokens), "--repeats",
                   str(repeats), "--threads", str(threads), "--dtype", octavo_dtype]
            print(f"running {engine} (W9, own process) ...", flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            if proc.returncode != 0 or not lines:
                results[engine] = {"error": (proc.stderr or proc.stdout).strip()[-1500:]}
            else:
                results[engine] = json.loads(lines[-1])
    finally:
        os.unlink(inputs)
    return results


def print_peers(results: dict[str, Any]) -> None:
    print()
    print("== W9 batch-1 decode against llama.cpp (same GGUF file, same run) ==")
    print(f"{'engine':<11}{'decode b1 tok/s':>17}{'TTFT 512 s':>12}{'W6 b32 tok/s':>14}"
          f"{'peak RSS MiB':>14}   weights")
    for name in ("llamacpp", "octavo"):
        r = results.get(name, {})
        if "error" in r:
            print(f"{name:<11} FAILED: {r['error'][-300:]}")
            continue
        w6 = f"{r['w6_tok_s']:.1f}" if "w6_tok_s" in r else "-"
        print(f"{r['engine']:<11}{r['decode_tok_s_b1']:>17.1f}{r['ttft_512_s']:>12.3f}{w6:>14}"
              f"{r['peak_rss_mib']:>14.0f}   {r['quantization']}")
    a, b = results.get("octavo", {}), results.get("llamacpp", {})
    if "decode_tok_s_b1" in a and "decode_tok_s_b1" in b:
        print(f"octavo / llama.cpp: decode {a['decode_tok_s_b1'] / b['decode_tok_s_b1']:.2f}x "
              f"(target >= 1.2x), TTFT {b['ttft_512_s'] / a['ttft_512_s']:.2f}x faster, "
              f"peak RSS {a['peak_rss_mib'] / b['peak_rss_mib']:.2f}x (target <= 1.25x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("octavo", "llamacpp"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True, help='JSON {"chat": [[ids]], "long": [ids]}')
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="Octavo's dtype (auto: kept quantized)")
    args = ap.parse_args()
    with open(args.inputs) as f:
        inputs = json.load(f)
    if args.engine == "octavo":
        out = child_octavo(args.model, inputs["chat"], inputs["long"], args.max_tokens,
                           args.repeats, args.dtype)
    else:
        out = child_llamacpp(args.model, inputs["chat"], inputs["long"], args.max_tokens,
                             args.repeats, args.threads)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
