"""W3 with its peer in one call: each engine's OpenAI-compatible server on loopback, the same
streamed /v1/completions requests at each request rate (benchmarks/serving.py's client), the
figures per engine and rate in one JSON, a plot of latency against throughput next to it (an
SVG file of the same name), and at rate inf Octavo's server against the offline
``LLM.generate`` on the same requests (issue 15 items 3 and 4).

    python benchmarks/serving_peers.py --shape qwen3-0.6b --engines octavo transformers \\
        --rates 4 16 64 inf --num-prompts 200 --seconds-per-rate 30 --json w3.json

Fair by construction:
- one random-weight checkpoint (benchmarks/random_checkpoint.py), written once, loaded by
  every engine: the same weights, dtype and word-level tokenizer; prompts are text of
  exactly --input-len words, which both servers tokenize to the same --input-len ids;
- greedy, --output-len tokens per request: Octavo is told ``ignore_eos``; transformers serve
  refuses that field, but the checkpoint names no EOS token, so its continuous batching runs
  every request to ``max_tokens`` too (each run records the tokens the servers report);
- the same requests, arrival times (Poisson, seeded) and client for every engine; at a finite
  rate --seconds-per-rate caps the number of requests (rate x seconds), the same for all;
- --time-limit-per-rate stops a run that a slow engine would stretch past the call's budget:
  the requests it cuts are counted apart (``cut``) and the rates after it still run.

Engines: ``octavo`` (``octavo serve``) and ``transformers`` (``transformers serve
--continuous-batching``, the model preloaded). More flags for either: --octavo-args,
--transformers-args.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import serving  # noqa: E402
from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402
from benchmarks.random_checkpoint import ids_to_text, write_checkpoint  # noqa: E402
from benchmarks.serving_vs_offline import (  # noqa: E402
    _free_port,
    _tree_cpu,
    _wait_healthy,
    run_offline,
)
from benchmarks.svg_plot import Panel, Series, render  # noqa: E402
from benchmarks.workloads import SHAPES  # noqa: E402

ENGINES = ("octavo", "transformers")


def server_command(engine: str, folder: str, port: int, args) -> list[str]:
    """The command line that starts ``engine``'s OpenAI server on 127.0.0.1:port."""
    if engine == "octavo":
        return [sys.executable, "-m", "octavo.entrypoints.cli", "serve", folder,
                "--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning",
                "--dtype", args.dtype, "--max-model-len", "2048",
                "--max-num-seqs", str(args.max_num_seqs),
                "--max-num-batched-tokens", "16384", "--disable-log-stats",
                *shlex.split(args.octavo_args)]
    if engine == "transformers":
        extra = shlex.split(args.transformers_args)
        if args.device == "cpu" and "--cb-num-blocks" not in extra:
            # On a CPU its cache and batch are sized from the host's memory (20 GB for a
            # 1-layer toy model, killed by the OOM killer here): a test's, 512 x 16 tokens.
            extra += ["--cb-num-blocks", "512", "--cb-block-size", "16",
                      "--cb-max-batch-tokens", "1024"]
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", folder,
                "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
                "--dtype", args.dtype, "--device", args.device, "--log-level", "warning",
                *extra]
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


# Extra request fields per engine (see serving.one_request): transformers serve answers 422
# to any field outside its schema, ignore_eos included.
EXTRA_BODY = {"octavo": None, "transformers": {}}


def requests_at(rate: float, args, engine: str = "") -> int:
    """How many of the prompts a run of ``engine`` at ``rate`` sends: the first n of one
    list, so an engine given fewer gets a prefix of the others' requests."""
    n = dict(args.engine_num_prompts).get(engine, args.num_prompts)
    if math.isinf(rate) or args.seconds_per_rate is None:
        return n
    return max(1, min(n, math.ceil(rate * args.seconds_per_rate)))


def _engine_count(text: str) -> tuple[str, int]:
    engine, _, n = text.partition("=")
    if engine not in ENGINES or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected ENGINE=N with ENGINE in {ENGINES}, "
                                         f"N >= 1; got {text!r}")
    return engine, int(n)


def _server_cpu(pid: int) -> float | None:
    """CPU seconds of the server's process tree so far (None without psutil)."""
    try:
        return sum(_tree_cpu(pid))
    except ImportError:
        return None


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL to the server's process group (it started one: its children
    are ours too) if it has not exited within ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def bench_engine(engine: str, folder: str, prompts: list[str], args, log_path: str
                 ) -> dict[str, Any]:
    """Start ``engine``'s server, warm it, run every rate, stop it."""
    port = _free_port()
    cmd = server_command(engine, folder, port, args)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    out: dict[str, Any] = {"command": shlex.join(cmd), "log": os.path.basename(log_path),
                           "runs": []}
    print(f"== {engine}: {out['command']}", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    extra = EXTRA_BODY[engine]
    try:
        _wait_healthy(port, proc, timeout=args.startup_timeout)
        out["startup_s"] = time.perf_counter() - t0
        # The first requests build what an engine builds lazily (transformers: its continuous
        # batching manager; both: kernels for new shapes), then a batch of them.
        # No time limit: a first request may compile kernels for minutes.
        for n in (1, args.warmup_requests):
            warm = serving.run_rate(base, folder, prompts[:n], 4, math.inf, None, args.seed,
                                    extra_body=extra)
            if warm["failed"]:
                raise RuntimeError(f"{engine} warm-up failed: {warm['errors']}")
        for rate in args.rates:
            n = requests_at(rate, args, engine)
            cpu0 = _server_cpu(proc.pid)
            run = serving.run_rate(base, folder, prompts[:n], args.output_len, rate, None,
                                   args.seed, args.client_processes, extra_body=extra,
                                   time_limit_s=args.time_limit_per_rate)
            cpu1 = _server_cpu(proc.pid)
            k = max(run["total_output_tokens"], 1) / 1000
            run["server_cpu_s_per_1k_tokens"] = (None if cpu0 is None or cpu1 is None
                                                 else (cpu1 - cpu0) / k)
            run["expected_output_tokens"] = run["completed"] * args.output_len
            serving.print_table(run)
            if run["total_output_tokens"] != run["expected_output_tokens"]:
                print(f"WARNING: {engine} produced {run['total_output_tokens']} output "
                      f"tokens, expected {run['expected_output_tokens']}", flush=True)
            out["runs"].append(run)
            if proc.poll() is not None:
                raise RuntimeError(f"{engine}'s server exited with {proc.returncode}")
    except Exception as e:  # noqa: BLE001 - report it, keep the other engines' figures
        out["error"] = f"{type(e).__name__}: {e}"
        print(f"{engine} FAILED: {out['error']}; the end of its log ({log_path}):",
              flush=True)
        with open(log_path, errors="replace") as f:
            print("".join(f.readlines()[-30:]), flush=True)
    finally:
        stop(proc)
    return out


def in_child(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a process of its own: what it holds on the device (a CUDA
    context, cached allocator blocks, an engine) goes back when it ends, before the next
    server starts."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args, kwargs)


def _rate_label(rate: float | str) -> str:
    return f"{rate:g}/s" if isinstance(rate, float | int) else f"{rate}/s"


def plot(result: dict[str, Any], path: str) -> None:
    """TPOT p50 and TTFT p50 against output tok/s, one line per engine across the rates."""
    def series(key: str, stat: str) -> list[Series]:
        return [Series(engine, [(r["output_throughput"], r[key][stat],
                                 _rate_label(r["request_rate"])) for r in e["runs"]
                                if r["completed"]])
                for engine, e in result["engines"].items()]

    x = "output tokens/s (log)"
    panels = [Panel("TPOT p50", x, "ms per output token (log)", series("tpot_ms", "median")),
              Panel("TPOT p99", x, "ms per output token (log)", series("tpot_ms", "p99")),
              Panel("TTFT p50", x, "ms to the first token (log)", series("ttft_ms", "median"))]
    title = (f"W3 {result['shape']}, {result['input_len']} in / {result['output_len']} out, "
             f"{result['device'].get('gpu') or result['device']['cpu']}")
    note = (f"points: request rate (req/s); commit {result['commit']}; "
            f"{result['date']}")
    with open(path, "w") as f:
        f.write(render(panels, title, note))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--rates", type=float, nargs="+", default=[4.0, 16.0, 64.0, math.inf])
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--engine-num-prompts", type=_engine_count, nargs="*", default=[],
                    metavar="ENGINE=N", help="fewer requests for a slow engine (the first N "
                    "of the same list), e.g. transformers=100")
    ap.add_argument("--seconds-per-rate", type=float, default=None,
                    help="at a finite rate send min(num-prompts, rate x this) requests")
    ap.add_argument("--time-limit-per-rate", type=float, default=None,
                    help="cut a run at this many seconds (see `cut` in its figures)")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None,
                    help="transformers serve's --device (default cuda:0 when present, else cpu)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--client-processes", type=int, default=4)
    ap.add_argument("--warmup-requests", type=int, default=16)
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-offline", action="store_true",
                    help="skip Octavo's offline LLM.generate on the rate-inf requests")
    ap.add_argument("--checkpoint", default=None,
                    help="a folder from an earlier run (random_checkpoint.write_checkpoint) "
                    "instead of writing one")
    ap.add_argument("--keep-checkpoint", action="store_true",
                    help="keep the checkpoint this run wrote (default: removed at the end)")
    ap.add_argument("--octavo-args", default="", help="more `octavo serve` flags, one string")
    ap.add_argument("--transformers-args", default="",
                    help="more `transformers serve` flags, one string")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "w3.json"))
    args = ap.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"

    vocab = SHAPES[args.shape]["vocab_size"]
    t0 = time.perf_counter()
    folder = args.checkpoint or in_child(write_checkpoint, args.shape, args.dtype)
    print(f"checkpoint {folder} ({time.perf_counter() - t0:.1f} s)", flush=True)
    ids = serving.make_prompts(args.num_prompts, args.input_len, min(vocab, 10000), args.seed)
    prompts = [ids_to_text(p) for p in ids]
    stem = os.path.splitext(args.json)[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "W3 serving with peers", "shape": args.shape, "dtype": args.dtype,
        "input_len": args.input_len, "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "engine_num_prompts": dict(args.engine_num_prompts), "seconds_per_rate": args.seconds_per_rate,
        "time_limit_per_rate": args.time_limit_per_rate,
        "rates": ["inf" if math.isinf(r) else r for r in args.rates],
        "device": in_child(device_info), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
        "engines": {}, "offline": None, "server_inf_vs_offline": None,
        "plot": os.path.basename(stem + ".svg")}
    for engine in args.engines:
        result["engines"][engine] = bench_engine(engine, folder, prompts, args,
                                                 f"{stem}.{engine}.log")
        if engine == "octavo" and not args.no_offline and math.inf in args.rates:
            # The rate-inf run's requests, as text: offline tokenizes them too.
            same = prompts[:requests_at(math.inf, args, engine)]
            result["offline"] = in_child(run_offline, folder, same, args.output_len,
                                         args.dtype, max_num_seqs=args.max_num_seqs)
            inf = next((r for r in result["engines"]["octavo"]["runs"]
                        if r["request_rate"] == "inf"), None)
            if inf is not None:
                result["server_inf_vs_offline"] = (inf["output_throughput"]
                                                   / result["offline"]["output_tok_s"])
            print(f"offline LLM.generate on the same {len(same)} requests: "
                  f"{result['offline']['output_tok_s']:,.0f} output tok/s; server at rate "
                  f"inf: {result['server_inf_vs_offline'] or float('nan'):.1%} of it",
                  flush=True)
        plot(result, stem + ".svg")  # after each engine: a later failure keeps these
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    print_json_result(result, args.json)
    summary(result)  # last: the end of the output is what a remote call shows
    if args.checkpoint is None and not args.keep_checkpoint:
        shutil.rmtree(folder, ignore_errors=True)  # an 8B one is 16 GB of the disk
    ok = all("error" not in e and all(r["failed"] == 0 for r in e["runs"])
             for e in result["engines"].values())
    return 0 if ok else 1


def summary(result: dict[str, Any]) -> None:
    print("engine        rate   reqs  cut    req/s    out tok/s   TTFT p50/p99 ms     "
          "TPOT p50/p99 ms    ITL p50/p99 ms")
    for engine, e in result["engines"].items():
        for r in e["runs"]:
            print(f"{engine:12s} {r['request_rate']!s:>5} {r['completed']:6d} "
                  f"{r.get('cut', 0):4d} {r['request_throughput']:8.2f} "
                  f"{r['output_throughput']:12,.0f}  "
                  f"{r['ttft_ms']['median']:8.1f}/{r['ttft_ms']['p99']:8.1f}  "
                  f"{r['tpot_ms']['median']:7.2f}/{r['tpot_ms']['p99']:7.2f}  "
                  f"{r['itl_ms']['median']:7.2f}/{r['itl_ms']['p99']:7.2f}")
        if "error" in e:
            print(f"{engine:12s} error: {e['error']}")
    if result["offline"]:
        print(f"offline LLM.generate: {result['offline']['output_tok_s']:,.0f} output tok/s; "
              f"server at rate inf / offline: {result['server_inf_vs_offline']}")


if __name__ == "__main__":
    sys.exit(main())
