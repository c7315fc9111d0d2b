"""How long GET /health waits while the servers parse and validate one large request body.

    python benchmarks/health_during_large_body.py [--bodies NAME ...] [--rounds 3]
        [--poll-ms 10] [--no-freeze]

Both servers (OpenAI-compatible and the simple /generate one) run in this process on the
embedded default model, each on a real uvicorn server on loopback, with the startup heap
frozen as ``octavo serve`` freezes it. A client in another process (so that its own threads
do not compete with the servers' for this process's GIL) then, for each body: polls /health
every --poll-ms over one keep-alive connection, POSTs the body (about 8 MB of valid JSON,
under the default --max-body-bytes of 8 MiB) on a second connection, and reports the body's
status and time and the /health probes that overlapped it: how many, their median and
their worst latency. Every body but one is refused (400): what is measured is the server's
reading of it, not generation; chat-nested-lists-accepted goes on to the chat template
(which copies the message's extra field, 2 million lists) and one token.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_LEN = 512
MAX_BODY = 8 * 2**20
NESTED = 2_000_000  # [[0],[0],...]: 4 bytes a list, 8 MB


def _token_lists() -> dict:
    # 1024 prompts (the server's cap) of 1,300 token ids each.
    return {"prompt": [[(i * 7919 + j * 104729) % 49152 for j in range(1300)]
                       for i in range(1024)], "max_tokens": 1}


def _chat_parts() -> dict:
    parts = [{"type": "text", "text": "hi"}] * 70
    return {"messages": [{"role": "user", "content": parts}] * 4096, "max_tokens": 1}


# name -> (server, path, body builder)
BODIES = {
    "completions-token-lists": ("openai", "/v1/completions", _token_lists),
    "completions-nested-lists": ("openai", "/v1/completions",
                                 lambda: {"prompt": [[0]] * NESTED}),
    "chat-content-parts": ("openai", "/v1/chat/completions", _chat_parts),
    # Refused once validated (max_tokens 0), and accepted: the template then renders.
    "chat-nested-lists": ("openai", "/v1/chat/completions", lambda: {
        "messages": [{"role": "user", "content": "hi", "x": [[0]] * NESTED}], "max_tokens": 0}),
    "chat-nested-lists-accepted": ("openai", "/v1/chat/completions", lambda: {
        "messages": [{"role": "user", "content": "hi", "x": [[0]] * NESTED}], "max_tokens": 1}),
    "generate-nested-lists": ("simple", "/generate",
                              lambda: {"prompt": "hi", "stop": [[0]] * NESTED}),
}


def _probe(port: int, period: float, stop: threading.Event, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            t1 = time.perf_counter()
            assert resp.status == 200, resp.status
            out.append((t0, t1))
            time.sleep(max(0.0, period - (t1 - t0)))
    finally:
        conn.close()


def _one(port: int, path: str, raw: bytes, period: float) -> dict:
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(port, period, stop, samples))
    prober.start()
    time.sleep(0.3)  # the probe connection is warm and probing
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", path, body=raw, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    answer = resp.read()
    t1 = time.perf_counter()
    conn.close()
    time.sleep(0.2)
    stop.set()
    prober.join()
    during = [b - a for a, b in samples if b >= t0 and a <= t1]
    return {"status": resp.status, "seconds": t1 - t0, "probes": len(during),
            "median_ms": 1e3 * statistics.median(during) if during else None,
            "worst_ms": 1e3 * max(during) if during else None,
            "error": json.loads(answer).get("error", {}).get("message", "")[:100]
            if resp.status != 200 else ""}


def client(ports: dict[str, int], names: list[str], rounds: int, period: float) -> list[dict]:
    """The measurements, one dict per body (run in a process of its own)."""
    results = []
    for name in names:
        server, path, build = BODIES[name]
        raw = json.dumps(build(), separators=(",", ":")).encode()
        assert len(raw) <= MAX_BODY, (name, len(raw))
        runs = [_one(ports[server], path, raw, period) for _ in range(rounds)]
        results.append({"body": name, "path": path, "bytes": len(raw), "runs": runs})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", nargs="+", choices=sorted(BODIES), default=list(BODIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--poll-ms", type=float, default=10.0)
    p.add_argument("--no-freeze", action="store_true",
                   help="leave the startup heap to the collector (octavo serve freezes it)")
    args = p.parse_args(argv)

    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM
    from octavo.entrypoints import api_server as simple_server
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app
    from octavo.startup_heap import freeze_startup_heap
    from tests.running_server import RunningServer

    engine = AsyncLLM.from_engine_args(EngineArgs(max_model_len=MAX_LEN))
    servers = {"openai": RunningServer(build_app(engine, ServerSettings(shutdown_engine=False))),
               "simple": RunningServer(simple_server.build_app(engine, shutdown_engine=False))}
    if not args.no_freeze:
        freeze_startup_heap()
    try:
        with mp.get_context("spawn").Pool(1) as pool:
            results = pool.apply(client, ({k: s.port for k, s in servers.items()},
                                          args.bodies, args.rounds, args.poll_ms / 1e3))
    finally:
        for s in servers.values():
            s.stop()
        engine.shutdown()
    print(f"/health polled every {args.poll_ms:g} ms while one body is read; "
          f"{args.rounds} rounds each")
    print(f"{'body':28} {'bytes':>9} {'status':>6} {'request s':>9} {'probes':>6} "
          f"{'median ms':>9} {'worst ms':>9}")
    for r in results:
        for run in r["runs"]:
            med = "-" if run["median_ms"] is None else f"{run['median_ms']:.1f}"
            worst = "-" if run["worst_ms"] is None else f"{run['worst_ms']:.1f}"
            print(f"{r['body']:28} {r['bytes']:>9} {run['status']:>6} {run['seconds']:>9.3f} "
                  f"{run['probes']:>6} {med:>9} {worst:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
