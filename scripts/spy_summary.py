"""Summarize py-spy's raw (collapsed) samples of a server's process tree: samples per process
and thread, then each thread's heaviest leaf frames and the frames its samples pass through.

    py-spy record --subprocesses --threads --idle --format raw -o spy.txt --pid PID
    python scripts/spy_summary.py spy.txt [--top 15] [--min-share 0.02]

A line is ``process PID:"cmdline";thread (TID);frame;...;frame COUNT`` (``--threads`` adds
the thread element; without it every sample of a process counts as one thread). Frames are
``function (file:line)``; the line number is dropped so a function's lines add up.
"""

from __future__ import annotations

import argparse
import collections
import re


def _frame(text: str) -> str:
    return re.sub(r":\d+\)$", ")", text.strip())


def _split(stack: str) -> list[str]:
    """The stack's elements: split at semicolons outside double quotes (a process element's
    command line may hold some)."""
    parts, current, quoted = [], [], False
    for ch in stack:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--min-share", type=float, default=0.02,
                    help="list frames holding at least this share of a thread's samples")
    args = ap.parse_args()
    threads: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter)
    leaves: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter)
    totals: collections.Counter = collections.Counter()
    for line in open(args.path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        parts = _split(stack)
        # --subprocesses nests a child's "process" element under its parent's: the last one
        # is the sampled process.
        last = next((i for i in range(len(parts) - 1, -1, -1)
                     if parts[i].startswith("process ")), -1)
        proc = parts[last].split(":", 1)[0] if last >= 0 else "process ?"
        rest = parts[last + 1:]
        thread = "all"
        if rest and rest[0].startswith("thread "):
            thread, rest = rest[0], rest[1:]
        key = (proc, thread)
        totals[key] += n
        frames = [_frame(f) for f in rest]
        for f in set(frames):
            threads[key][f] += n
        leaves[key][frames[-1] if frames else "(no frame)"] += n
    grand = sum(totals.values())
    print(f"{grand} samples")
    for key, total in totals.most_common():
        if total < args.min_share * grand:
            continue
        print(f"\n== {key[0]} {key[1]}: {total} samples ({100 * total / grand:.1f}%)")
        print("  leaf frames:")
        for frame, n in leaves[key].most_common(args.top):
            print(f"    {100 * n / total:5.1f}%  {frame}")
        print("  through (inclusive):")
        shown = 0
        for frame, n in threads[key].most_common():
            if n < args.min_share * total or shown >= args.top * 2:
                break
            print(f"    {100 * n / total:5.1f}%  {frame}")
            shown += 1


if __name__ == "__main__":
    main()
