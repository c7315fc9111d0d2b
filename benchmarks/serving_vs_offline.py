"""W3 on a GPU in one call: start the OpenAI-compatible server (dummy weights of a benchmark
shape), load it with benchmarks/serving.py at the given request rates, stop it, then run the
same requests through the offline ``LLM.generate`` and print the server's output tok/s at
rate inf against it (the server's own overhead, issue 15 item 4).

    python benchmarks/serving_vs_offline.py [--shape qwen3-0.6b] [--rates inf 64 16]
        [--num-prompts 1000] [--input-len 1024] [--output-len 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from benchmarks import serving

    folder = write_config(args.shape)
    engine_flags = ["--model", folder, "--load-format", "dummy", "--dtype", "bfloat16",
                    "--max-model-len", "2048", "--max-num-seqs", str(args.max_num_seqs),
                    "--max-num-batched-tokens", "16384", "--disable-log-stats",
                    "--distributed-executor-backend", args.executor]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "octavo.entrypoints.openai.api_server",
                             "--host", "127.0.0.1", "--port", str(port),
                             "--uvicorn-log-level", "warning", *engine_flags])
    out_json = os.path.join(os.environ.get("OUT", "/tmp"), "w3_runs.json")
    try:
        _wait_healthy(port, proc)
        rates = ["inf" if math.isinf(r) else str(r) for r in args.rates]
        serving.main(["--base-url", f"http://127.0.0.1:{port}", "--input-len",
                      str(args.input_len), "--output-len", str(args.output_len),
                      "--num-prompts", str(args.num_prompts), "--request-rate", *rates,
                      "--output-json", out_json])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    with open(out_json) as f:
        runs = json.load(f)["runs"]

    from octavo import LLM, SamplingParams

    llm = LLM(model=folder, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
              max_model_len=2048, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=16384)
    prompts = serving.make_prompts(args.num_prompts, args.input_len, 10000, 0)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    offline = sum(len(o.outputs[0].token_ids) for o in outs) / wall
    inf_run = next((r for r in runs if r["request_rate"] == "inf"), None)
    ratio = None if inf_run is None else inf_run["output_throughput"] / offline
    served = "n/a" if inf_run is None else f"{inf_run['output_throughput']:,.0f}"
    share = "n/a" if ratio is None else f"{ratio:.1%}"
    print(f"offline LLM.generate on the same {args.num_prompts} requests: {offline:,.0f} "
          f"output tok/s; server at rate inf: {served} tok/s ({share} of offline)")
    print_json_result({"benchmark": "W3", "shape": args.shape, "executor": args.executor,
                       "device": device_info(),
                       "commit": git_commit(), "runs": runs, "offline_output_tok_s": offline,
                       "server_inf_vs_offline": ratio}, args.json)


if __name__ == "__main__":
    main()
