"""What the ``ray`` executor costs on this machine when it starts its own local Ray cluster:
the time to a ready engine (Ray's start, the actors' start and load), the resident memory of
every process it started (driver included), and the addresses they listen on (loopback only).

    python benchmarks/ray_local_cluster.py --model PATH [--tensor-parallel-size 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time


def _tree(root: int) -> list[tuple[int, int, str]]:
    """(pid, rss KiB, command) of ``root`` and every process below it."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,args="], capture_output=True,
                         text=True, check=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines() if line.strip()]
    pids, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid, *_ in rows:
            if int(ppid) in pids and int(pid) not in pids:
                pids.add(int(pid))
                grew = True
    return [(int(r[0]), int(r[2]), r[3] if len(r) > 3 else "") for r in rows
            if int(r[0]) in pids and not r[3].startswith("ps ")]


def _listening(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return sorted({line.split()[3] for line in out.splitlines()
                   if any(f"pid={p}," in line for p in pids)})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tensor-parallel-size", type=int, default=2)
    args = p.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    from octavo import LLM, SamplingParams

    start = time.monotonic()
    import ray

    from octavo.executor.ray_executor import connect
    connect(ray)
    ray_s = time.monotonic() - start
    llm = LLM(model=args.model, dtype="float32", skip_tokenizer_init=True, max_model_len=64,
              tensor_parallel_size=args.tensor_parallel_size, distributed_executor_backend="ray")
    ready_s = time.monotonic() - start
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    time.sleep(1)
    procs = _tree(os.getpid())
    for pid, rss, cmd in procs:
        print(f"{rss / 1024:8.0f} MiB  {pid:>7}  {cmd[:90]}")
    total = sum(rss for _, rss, _ in procs) / 1024
    print(f"Ray started in {ray_s:.1f} s; engine ready (TP={args.tensor_parallel_size} actors "
          f"loaded) at {ready_s:.1f} s; resident {total:.0f} MiB in {len(procs)} processes")
    print("listening:", ", ".join(_listening({pid for pid, _, _ in procs})))
    llm.llm_engine.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
