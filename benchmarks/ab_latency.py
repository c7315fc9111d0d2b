"""W4 latency under several environment variants, alternated in separate processes.

Most decode-path switches (``OCTAVO_*``) are read when a CUDA graph is captured or a kernel is
launched, so a variant needs a process of its own; and one process's timing of W4's batch 32
drifted by ~5% between runs of the same code on an H200. This runs ``benchmarks/latency.py``
once per variant per round, in the order A B ... then ... B A (so no variant always runs first
on a fresh machine), and prints, per batch size, each variant's median over rounds, its
range, and its ratio to the first variant.

    python benchmarks/ab_latency.py --variant off OCTAVO_L2_PREFETCH=off --variant on \\
        [--rounds 2] [--batch-sizes 1,32] [--repeat 3] [--json-out ab.json] [-- LATENCY_ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_variant(items: list[str]) -> tuple[str, dict[str, str]]:
    """["name", "K=V", ...] -> (name, {K: V})."""
    name, env = items[0], {}
    for item in items[1:]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"variant {name!r}: {item!r} is not NAME=VALUE")
        env[key] = value
    return name, env


def order(variants: list, rounds: int) -> list:
    """Alternating order: forward on even rounds, reversed on odd ones."""
    out = []
    for r in range(rounds):
        out += variants if r % 2 == 0 else variants[::-1]
    return out


def summarize(runs: list[dict]) -> list[dict]:
    """Per (variant, batch): the median over runs of each run's ms per token, min and max,
    and the ratio to the first variant's median."""
    names = list(dict.fromkeys(r["variant"] for r in runs))
    batches = list(dict.fromkeys(row["batch"] for r in runs for row in r["rows"]))
    table = []
    for bs in batches:
        base = None
        for name in names:
            ms = [row["ms_per_output_token"] for r in runs if r["variant"] == name
                  for row in r["rows"] if row["batch"] == bs]
            if not ms:
                continue
            med = statistics.median(ms)
            base = med if base is None else base
            table.append({"batch": bs, "variant": name, "median_ms": med, "min_ms": min(ms),
                          "max_ms": max(ms), "runs": len(ms), "vs_first": med / base})
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", nargs="+", required=True,
                    metavar=("NAME", "ENV=VALUE"), help="a name, then its environment")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per latency.py run")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("latency_args", nargs="*", help="more latency.py arguments, after --")
    args = ap.parse_args()
    try:
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        ap.error(str(e))
    if len({name for name, _ in variants}) != len(variants):
        ap.error("variant names must differ")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, env) in enumerate(order(variants, args.rounds)):
            out = os.path.join(tmp, f"run{i}.json")
            cmd = [sys.executable, os.path.join(HERE, "latency.py"), "--batch-sizes",
                   args.batch_sizes, "--repeat", str(args.repeat), "--json-out", out,
                   *args.latency_args]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True,
                                  text=True, timeout=args.timeout)
            if proc.returncode != 0:
                print(f"{name}: latency.py failed (rc {proc.returncode})\n"
                      f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}", flush=True)
                continue
            with open(out) as f:
                result = json.load(f)
            runs.append({"variant": name, "env": env, "child_env": result.get("env", {}),
                         "commit": result["commit"],
                         "rows": result["rows"], "seconds": time.perf_counter() - t0})
            cells = ", ".join(f"b{row['batch']} {row['ms_per_output_token']:.3f}"
                              for row in result["rows"])
            print(f"run {i}: {name:16s} {cells} ms/token", flush=True)
    table = summarize(runs)
    print(f"{'batch':>5} {'variant':16s} {'median ms':>9} {'range':>13} {'vs first':>8}")
    for t in table:
        print(f"{t['batch']:5d} {t['variant']:16s} {t['median_ms']:9.3f} "
              f"{t['min_ms']:6.3f}-{t['max_ms']:.3f} {t['vs_first']:8.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"benchmark": "ab_latency (W4)", "date": time.strftime("%Y-%m-%d"),
                       "variants": [{"name": n, "env": e} for n, e in variants],
                       "runs": runs, "summary": table}, f, indent=2)
    if len(runs) < len(variants) * args.rounds:
        sys.exit(1)


if __name__ == "__main__":
    main()
