"""W3 on a GPU in one call: start the OpenAI-compatible server (dummy weights of a benchmark
shape), load it with benchmarks/serving.py at the given request rates, stop it, then run the
same requests through the offline ``LLM.generate`` and print the server's output tok/s at
rate inf against it (the server's own overhead, issue 15 item 4).

    python benchmarks/serving_vs_offline.py [--shape qwen3-0.6b] [--rates inf 64 16]
        [--num-prompts 1000] [--input-len 1024] [--output-len 128] [--json out.json]
        [--server-args="--engine-process"]

Besides the throughputs it prints CPU seconds per 1,000 output tokens: of the server's process
tree, of this process while it is the benchmark client, and of the offline run. They are the
figures to compare on a loaded machine, where wall-clock throughput is noise; and a client
near a full core per second is itself the limit (``--shape tiny-qwen3`` reproduces the GPU's
situation on a CPU: an engine fast enough that serving costs dominate).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402
from benchmarks.workloads import SHAPES, write_config  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--rates", type=float, nargs="+", default=[math.inf, 64.0, 16.0])
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--executor", default="uni", choices=["uni", "mp"],
                    help="the server's --distributed-executor-backend (mp: the model runner "
                    "in its own process, off the server's GIL); offline runs uni")
    ap.add_argument("--client-processes", type=int, default=4,
                    help="benchmark client processes (one Python client can be the limit)")
    ap.add_argument("--offline-skip-tokenizer", action="store_true",
                    help="offline without a tokenizer (no detokenization), as before "
                    "2026-12-01; by default offline loads the tokenizer the server loads and "
                    "returns text, as LLM.generate does by default and the server must")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--server-args", default="",
                    help="more flags for the server, one string (e.g. \"--engine-process\")")
    ap.add_argument("--preconnect", action="store_true",
                    help="the client opens its connections before the clock starts "
                    "(benchmarks/serving.py --preconnect)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from benchmarks import serving

    folder = write_config(args.shape)
    engine_flags = ["--model", folder, "--load-format", "dummy", "--dtype", args.dtype,
                    "--max-model-len", "2048", "--max-num-seqs", str(args.max_num_seqs),
                    "--max-num-batched-tokens", "16384", "--disable-log-stats",
                    "--distributed-executor-backend", args.executor]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "octavo.entrypoints.openai.api_server",
                             "--host", "127.0.0.1", "--port", str(port),
                             "--uvicorn-log-level", "warning", *engine_flags,
                             *shlex.split(args.server_args)])
    out_json = os.path.join(os.environ.get("OUT", "/tmp"), "w3_runs.json")
    runs = []
    try:
        _wait_healthy(port, proc)
        for rate in args.rates:
            server0, client0 = _tree_cpu(proc.pid), _self_cpu_s()
            serving.main(["--base-url", f"http://127.0.0.1:{port}", "--input-len",
                          str(args.input_len), "--output-len", str(args.output_len),
                          "--num-prompts", str(args.num_prompts), "--request-rate",
                          "inf" if math.isinf(rate) else str(rate), "--output-json", out_json,
                          "--client-processes", str(args.client_processes),
                          *(["--preconnect"] if args.preconnect else [])])
            server1, client_s = _tree_cpu(proc.pid), _self_cpu_s() - client0
            # The API server's own process, and its children (an engine process, workers).
            api_s, engine_s = server1[0] - server0[0], server1[1] - server0[1]
            server_s = api_s + engine_s
            with open(out_json) as f:
                run = json.load(f)["runs"][0]
            if run.get("client_cpu_s") is not None:  # the client's own processes
                client_s = run["client_cpu_s"]
            k = max(run["total_output_tokens"], 1) / 1000
            run["server_cpu_s_per_1k_tokens"] = server_s / k
            run["client_cpu_s_per_1k_tokens"] = client_s / k
            run["server_api_process_cpu_s_per_1k_tokens"] = api_s / k
            run["server_child_processes_cpu_s_per_1k_tokens"] = engine_s / k
            run["server_cpu_cores"] = server_s / run["duration_s"]
            run["client_cpu_cores"] = client_s / run["duration_s"]
            print(f"CPU per 1,000 output tokens: server {server_s / k:.3f} s "
                  f"({run['server_cpu_cores']:.2f} cores; API process {api_s / k:.3f} s, "
                  f"its child processes {engine_s / k:.3f} s), client {client_s / k:.3f} s "
                  f"({run['client_cpu_cores']:.2f} cores)")
            runs.append(run)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()

    prompts = serving.make_prompts(args.num_prompts, args.input_len, 10000, 0)
    off = run_offline(folder, prompts, args.output_len, dtype=args.dtype, load_format="dummy",
                      max_num_seqs=args.max_num_seqs,
                      skip_tokenizer=args.offline_skip_tokenizer)
    offline, offline_cpu_per_1k = off["output_tok_s"], off["cpu_s_per_1k_tokens"]
    inf_run = next((r for r in runs if r["request_rate"] == "inf"), None)
    ratio = None if inf_run is None else inf_run["output_throughput"] / offline
    served = "n/a" if inf_run is None else f"{inf_run['output_throughput']:,.0f}"
    share = "n/a" if ratio is None else f"{ratio:.1%}"
    print(f"offline LLM.generate on the same {args.num_prompts} requests: {offline:,.0f} "
          f"output tok/s; server at rate inf: {served} tok/s ({share} of offline)")
    print(f"offline CPU per 1,000 output tokens: {offline_cpu_per_1k:.3f} s "
          f"({off['cpu_cores']:.2f} cores); load average {os.getloadavg()}")
    print_json_result({"benchmark": "W3", "shape": args.shape, "executor": args.executor,
                       "offline_detokenizes": not args.offline_skip_tokenizer,
                       "server_args": args.server_args, "device": device_info(),
                       "commit": git_commit(), "runs": runs, "offline_output_tok_s": offline,
                       "offline_cpu_s_per_1k_tokens": offline_cpu_per_1k,
                       "server_inf_vs_offline": ratio, "load_average": os.getloadavg()},
                      args.json)


def run_offline(folder: str, prompts: list[list[int]] | list[str], output_len: int,
                dtype: str, load_format: str = "auto", max_num_seqs: int = 256,
                skip_tokenizer: bool = False) -> dict:
    """The same requests through the offline ``LLM.generate`` (greedy, EOS ignored, the
    server's engine limits): output tok/s and CPU seconds per 1,000 output tokens.
    ``prompts``: token ids, or text that the timed call tokenizes as a server does."""
    from octavo import LLM, SamplingParams

    llm = LLM(model=folder, load_format=load_format, dtype=dtype,
              skip_tokenizer_init=skip_tokenizer, max_model_len=2048,
              max_num_seqs=max_num_seqs, max_num_batched_tokens=16384)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len)
    inputs = [p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:1], SamplingParams(max_tokens=4), use_tqdm=False)
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0, c0 = time.perf_counter(), _self_cpu_s()
    outs = llm.generate(inputs, params, use_tqdm=False)
    sync()
    wall, cpu = time.perf_counter() - t0, _self_cpu_s() - c0
    num_out = sum(len(o.outputs[0].token_ids) for o in outs)
    # Compare with an engine process's own line ("step timings", logged at its shutdown
    # under OCTAVO_LOG_STEP_TIMINGS=1).
    timings = llm.llm_engine.timings.summary()
    print("offline step timings:", json.dumps(timings))
    return {"requests": len(prompts), "output_tokens": num_out, "wall_s": wall,
            "output_tok_s": num_out / wall, "cpu_s_per_1k_tokens": cpu / (num_out / 1000),
            "cpu_cores": cpu / wall, "step_timings": timings}


def _self_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _tree_cpu(pid: int) -> tuple[float, float]:
    """User + system CPU seconds so far of process ``pid``, and of its live descendants (an
    engine process, workers)."""
    import psutil

    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except psutil.Error:
        return 0.0, 0.0
    out = []
    for group in ([root], children):
        total = 0.0
        for p in group:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        out.append(total)
    return out[0], out[1]


if __name__ == "__main__":
    main()
