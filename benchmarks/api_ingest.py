"""How fast the OpenAI server's event loop takes in a burst (issue 15 item 4), without
sockets or a GPU: N streamed /v1/completions requests (1,024-id prompts) go through the
ASGI app at once, on an in-process AsyncLLM over a tiny random model, as W3's rate-inf
burst reaches the server.

    python benchmarks/api_ingest.py [--num-requests 1000] [--output-len 8] [--gc-gen0 N]
        [--profile]

Prints the event loop thread's CPU per request (``time.thread_time``: the engine thread's
work is not in it), the loop's garbage collections (time, count, longest pause), and when
the requests reached the engine (``LLMEngine.add_request``), from the burst's start: the
first, the 10th, the 256th (a full batch at W3's max_num_seqs) and the last. Compare
``OCTAVO_SERVER_EAGER_SEND=0`` and ``=1`` (the send from the handler) or ``--gc-gen0``
values (the server process's young-generation threshold, ``OCTAVO_SERVER_GC_GEN0``) in
separate runs; wall-clock figures on a loaded 2-core machine are noisy, CPU and order are
not. The server's own setup is followed: the startup heap frozen, the middleware stack of
``octavo.entrypoints.launcher``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import threading
import time

sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import write_config  # noqa: E402


def _scope(body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/completions",
            "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--gc-gen0", type=int, default=None,
                    help="the young generation's threshold (default: what the server sets, "
                    "OCTAVO_SERVER_GC_GEN0)")
    ap.add_argument("--profile", action="store_true", help="cProfile the loop thread")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from octavo import envs
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM
    from octavo.entrypoints.launcher import DrainGate
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app
    from octavo.entrypoints.openai.middleware import ForwardedForMiddleware
    from octavo.metrics.gc_timer import GcTimer
    from octavo.startup_heap import freeze_startup_heap, tune_collector_for_serving

    llm = AsyncLLM.from_engine_args(EngineArgs(
        model=write_config("tiny-qwen3"), load_format="dummy", dtype="float32",
        max_model_len=2048, max_num_seqs=256))
    app = DrainGate(ForwardedForMiddleware(build_app(
        llm, ServerSettings(served_model_names=["bench"], shutdown_engine=False)), None))
    rng = random.Random(0)
    bodies = [json.dumps({
        "model": "bench", "prompt": [rng.randrange(10000) for _ in range(args.input_len)],
        "max_tokens": args.output_len, "ignore_eos": True, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True}}).encode()
        for _ in range(args.num_requests)]
    adds: list[float] = []
    real_add = llm.engine.add_request

    def add(*a, **k):
        adds.append(time.perf_counter())
        return real_add(*a, **k)

    llm.engine.add_request = add
    freeze_startup_heap()
    tune_collector_for_serving()
    if args.gc_gen0 is not None:
        gc.set_threshold(args.gc_gen0, *gc.get_threshold()[1:])
    clock = GcTimer(thread=threading.get_ident())  # the event loop's collections
    chunks = 0

    async def one(body: bytes) -> None:
        nonlocal chunks
        done = asyncio.Event()
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if pending:
                return pending.pop()
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal chunks
            if message["type"] == "http.response.body":
                chunks += 1
                if not message.get("more_body"):
                    done.set()
            elif message["type"] == "http.response.start" and message["status"] != 200:
                raise RuntimeError(f"HTTP {message['status']}")

        await app(_scope(body), receive, send)

    async def run() -> dict:
        nonlocal chunks
        await asyncio.gather(*(one(b) for b in bodies[:4]))  # warm-up
        adds.clear()
        clock.reset()
        chunks = 0
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu0, t0 = time.thread_time(), time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        reached = sorted(t - t0 for t in adds)

        def nth(i: int) -> float | None:
            return reached[i - 1] if len(reached) >= i else None

        return {"num_requests": args.num_requests, "output_len": args.output_len,
                "eager_send": envs.server_eager_send(), "gc_threshold": gc.get_threshold(),
                "wall_s": wall, "loop_cpu_s": cpu, "loop_cpu_ms_per_request":
                1e3 * cpu / args.num_requests, "chunks": chunks,
                **clock.summary(),
                "reached_engine_s": {"first": nth(1), "10th": nth(10), "256th": nth(256),
                                     "last": nth(len(reached))}}

    try:
        r = asyncio.run(run())
    finally:
        clock.stop()
        llm.shutdown()
    s = r["reached_engine_s"]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(f"{r['num_requests']} requests, eager send {r['eager_send']}, gc thresholds "
          f"{r['gc_threshold']}: loop CPU {r['loop_cpu_ms_per_request']:.3f} ms a request "
          f"(wall {r['wall_s']:.2f} s); collections {r['gc_ms']} ms by generation "
          f"({r['gc_collections']}), longest {r['gc_longest_ms']} ms; reached the engine at "
          f"{fmt(s['first'])} / {fmt(s['10th'])} / {fmt(s['256th'])} / {fmt(s['last'])} s "
          "(first / 10th / 256th / last)")
    line = json.dumps(r)
    print("RESULT_JSON " + line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
