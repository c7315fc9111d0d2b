"""W3 serving: load an OpenAI-compatible server with streaming /v1/completions requests.

Random token-id prompts of --input-len tokens, --output-len tokens each with ignore_eos,
--num-prompts requests arriving as a Poisson process at --request-rate (``inf``: all at once),
at most --max-concurrency in flight. Figures as `vllm bench serve` defines them: TTFT (send to
first streamed token chunk), TPOT = (latency - TTFT) / (output tokens - 1) per request, ITL
(gaps between streamed chunks, all requests pooled), E2E latency; mean, median, p99 each;
request throughput and output tok/s over the wall time of the run.

    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --request-rate 1 inf

Works against any server speaking the OpenAI completions API with token-id prompts and the
vLLM extension ``ignore_eos`` (Octavo, vLLM, SGLang).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx
except ImportError:  # this CI machine ships the client under its new name
    import httpx2 as httpx

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import git_commit, print_json_result  # noqa: E402


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    sent: float = 0.0  # time.monotonic() when the request went out


def make_prompts(num: int, input_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(num)]


# Body fields past the OpenAI schema. vLLM's ``ignore_eos`` makes every request produce
# max_tokens; a server that refuses unknown fields (transformers serve) gets {} and a model
# without an EOS id instead.
IGNORE_EOS = {"ignore_eos": True}


async def one_request(client: httpx.AsyncClient, url: str, model: str,
                      prompt: list[int] | str, output_len: int,
                      extra_body: dict | None = None) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            **(IGNORE_EOS if extra_body is None else extra_body),
            "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(sent=time.monotonic())
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"])
                    return res
                usage = chunk.get("usage")
                if usage:  # the closing chunk, which some servers give a choice without a token
                    res.output_tokens = usage["completion_tokens"]
                    res.prompt_tokens = usage.get("prompt_tokens") or 0
                elif chunk.get("choices"):
                    now = time.perf_counter()
                    if res.ttft == 0.0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.latency = time.perf_counter() - start
        res.ok = res.ttft > 0.0
        if not res.ok:
            res.error = "no token arrived"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan, "p99": math.nan}
    ordered = sorted(values)
    # p99 by linear interpolation between closest ranks (numpy's default percentile).
    pos = 0.99 * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    p99 = ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    return {"mean": statistics.fmean(values) * scale,
            "median": statistics.median(values) * scale, "p99": p99 * scale}


CUT = "cut at the time limit"


async def _send_all(base_url: str, model: str, prompts: list[list[int]] | list[str],
                    output_len: int, rate: float, max_concurrency: int | None, seed: int,
                    extra_body: dict | None = None, time_limit_s: float | None = None,
                    preconnect: bool = False, start_at: float | None = None
                    ) -> tuple[list[RequestResult], float, float]:
    """(results, first send, last answer) in time.monotonic() seconds. Past ``time_limit_s``
    no request is sent and those in flight are dropped: their results say ``CUT``.
    ``preconnect``: open as many keep-alive connections as requests may be in flight before
    the clock starts (see ``open_connections``); ``start_at``: the time.monotonic() the clock
    starts at."""
    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    rng = random.Random(seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        if preconnect:
            await open_connections(client, base_url,
                                   min(len(prompts), max_concurrency or len(prompts)))
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        async def limited(prompt: list[int] | str) -> RequestResult:
            if sem is None:
                return await one_request(client, url, model, prompt, output_len, extra_body)
            async with sem:
                return await one_request(client, url, model, prompt, output_len, extra_body)

        tasks = []
        start = time.monotonic()
        deadline = math.inf if time_limit_s is None else start + time_limit_s
        for i, prompt in enumerate(prompts):
            if time.monotonic() >= deadline:
                break
            tasks.append(asyncio.create_task(limited(prompt)))
            if math.isfinite(rate) and i + 1 < len(prompts):
                await asyncio.sleep(rng.expovariate(rate))
        if tasks:
            timeout = None if time_limit_s is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(tasks, timeout=timeout)
        end = time.monotonic()
        results = []
        for task in tasks:
            if task.done():
                results.append(task.result())
            else:
                task.cancel()
                results.append(RequestResult(error=CUT))
        results += [RequestResult(error=CUT) for _ in range(len(prompts) - len(tasks))]
        await asyncio.gather(*tasks, return_exceptions=True)
    return results, start, end


async def open_connections(client: httpx.AsyncClient, base_url: str, n: int) -> None:
    """Open ``n`` connections to the server and leave them in ``client``'s keep-alive pool:
    ``n`` concurrent GET /v1/models. A burst from a client that opens its connections inside
    the burst measures its own connects, and at rate inf it writes every request's head
    before any body (each task yields at its connect), so the server sees no complete
    request for a while; a client that keeps connections open (an SDK, a load balancer)
    does not. The servers' keep-alive timeout (uvicorn's default 5 s) must outlast the wait
    for the start."""
    url = base_url.rstrip("/") + "/v1/models"
    resps = await asyncio.gather(*(client.get(url) for _ in range(n)))
    bad = [r.status_code for r in resps if r.status_code != 200]
    if bad:
        raise RuntimeError(f"opening connections: GET /v1/models gave {bad[:5]}")


def _client_process(args: tuple) -> tuple[list[RequestResult], float, float, float]:
    """One of several client processes: its share of the requests; also its CPU seconds."""
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    start_at, *rest = args
    cpu0 = cpu()  # not the imports
    # Every process starts together (after opening its connections, with --preconnect).
    results, start, end = asyncio.run(_send_all(*rest, start_at=start_at))
    return results, start, end, cpu() - cpu0


def run_rate(base_url: str, model: str, prompts: list[list[int]] | list[str],
             output_len: int, rate: float, max_concurrency: int | None, seed: int,
             client_processes: int = 1, extra_body: dict | None = None,
             time_limit_s: float | None = None, preconnect: bool = False) -> dict[str, Any]:
    """One run at ``rate``. ``client_processes`` > 1 splits the requests over that many
    processes (each a share of the rate and of the concurrency, ``prompts[i::n]``): one
    Python client parsing every streamed event of a fast server can use a whole core and
    become the limit it measures. ``prompts``: token ids or text; ``extra_body``: see
    ``one_request``; ``time_limit_s``: a cap on the run, the requests it cuts are counted
    apart (``cut``), not as failures; ``preconnect``: each client process opens as many
    connections as it may have requests in flight before the clock starts
    (``open_connections``)."""
    n = max(1, min(client_processes, len(prompts)))
    client_cpu = None
    if n == 1:
        results, start, end = asyncio.run(_send_all(base_url, model, prompts, output_len, rate,
                                                    max_concurrency, seed, extra_body,
                                                    time_limit_s, preconnect))
    else:
        import multiprocessing

        share = None if max_concurrency is None else max(1, max_concurrency // n)
        start_at = time.monotonic() + (3.0 if preconnect else 1.0)
        jobs = [(start_at, base_url, model, prompts[i::n], output_len, rate / n, share,
                 seed + i, extra_body, time_limit_s, preconnect) for i in range(n)]
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            parts = pool.map(_client_process, jobs)
        by_proc = [p[0] for p in parts]
        results = [by_proc[i % n][i // n] for i in range(len(prompts))]
        start, end = min(p[1] for p in parts), max(p[2] for p in parts)
        client_cpu = sum(p[3] for p in parts)
    duration = end - start
    done = [r for r in results if r.ok]
    cut = sum(r.error == CUT for r in results)
    total_out = sum(r.output_tokens for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "request_rate": "inf" if math.isinf(rate) else rate,
        "max_concurrency": max_concurrency,
        "client_processes": n,
        "preconnect": preconnect,
        # CPU seconds of the client processes (None: the client is the calling process).
        "client_cpu_s": client_cpu,
        "completed": len(done), "failed": len(results) - len(done) - cut, "cut": cut,
        "errors": sorted({r.error for r in results if not r.ok and r.error != CUT})[:5],
        "duration_s": duration,
        # The server's count where it gives one (a text prompt's length is its tokenizer's).
        "total_input_tokens": sum(r.prompt_tokens or len(p)
                                  for p, r in zip(prompts, results) if r.ok),
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "output_throughput": total_out / duration,
        "ttft_ms": _stats([r.ttft for r in done]),
        "tpot_ms": _stats(tpots),
        "itl_ms": _stats([x for r in done for x in r.itl]),
        "e2el_ms": _stats([r.latency for r in done]),
        # When, from the run's start, the requests went out and their first tokens came
        # back (a burst's ramp: how long the server took to take every request in).
        "timeline_s": _timeline(results, done, start),
    }


def _timeline(results: list[RequestResult], done: list[RequestResult], start: float
              ) -> dict[str, float]:
    sent = [r.sent - start for r in results if r.sent]
    first = sorted(r.sent + r.ttft - start for r in done)
    if not sent or not first:
        return {}
    return {"last_sent": max(sent), "first_token": first[0],
            "first_token_p50": first[len(first) // 2], "first_token_last": first[-1]}


def print_table(r: dict[str, Any]) -> None:
    print(f"---- request rate {r['request_rate']} (max concurrency {r['max_concurrency']}) ----")
    cut = f" (cut at the time limit: {r['cut']})" if r.get("cut") else ""
    print(f"completed {r['completed']}, failed {r['failed']}{cut}, "
          f"duration {r['duration_s']:.2f} s")
    if r["errors"]:
        print(f"errors: {r['errors']}")
    print(f"request throughput {r['request_throughput']:.3f} req/s, "
          f"output {r['output_throughput']:.2f} tok/s")
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                      ("e2el_ms", "E2E")):
        s = r[key]
        print(f"{name:5s} ms  mean {s['mean']:9.2f}  median {s['median']:9.2f}  "
              f"p99 {s['p99']:9.2f}")
    t = r.get("timeline_s")
    if t:
        print(f"from the start, s: last request sent {t['last_sent']:.2f}; first tokens: first "
              f"{t['first_token']:.2f}, median {t['first_token_p50']:.2f}, "
              f"last {t['first_token_last']:.2f}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, nargs="+", default=[math.inf],
                   help="requests per second, Poisson arrivals; inf sends all at once; "
                        "several values run one after another")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=10000,
                   help="prompt token ids are drawn from [0, vocab-size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-processes", type=int, default=1,
                   help="split the requests over this many client processes, so that the "
                   "client's own parsing of every streamed event is not the limit")
    p.add_argument("--preconnect", action="store_true",
                   help="open the connections before the clock starts, as a client that "
                   "keeps them alive would have them (see open_connections)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)

    model = args.model
    if model is None:
        model = httpx.get(args.base_url.rstrip("/") + "/v1/models",
                          timeout=30).json()["data"][0]["id"]
    prompts = make_prompts(args.num_prompts, args.input_len, args.vocab_size, args.seed)
    print(f"W3 serving: {args.base_url} model={model} input_len={args.input_len} "
          f"output_len={args.output_len} num_prompts={args.num_prompts} "
          f"rates={args.request_rate} max_concurrency={args.max_concurrency} "
          f"client_processes={args.client_processes} preconnect={args.preconnect} "
          f"commit={git_commit()}")
    if not args.no_warmup:
        warm = run_rate(args.base_url, model, prompts[:1], 4, math.inf, None, args.seed)
        if warm["failed"]:
            print(f"warm-up failed: {warm['errors']}", file=sys.stderr)
            return 1
    runs = []
    for rate in args.request_rate:
        r = run_rate(args.base_url, model, prompts, args.output_len, rate,
                     args.max_concurrency, args.seed, args.client_processes,
                     preconnect=args.preconnect)
        print_table(r)
        runs.append(r)
    print_json_result({"workload": "W3", "base_url": args.base_url, "model": model,
                       "input_len": args.input_len, "output_len": args.output_len,
                       "num_prompts": args.num_prompts, "commit": git_commit(), "runs": runs},
                      args.output_json)
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
