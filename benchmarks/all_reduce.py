"""The tensor-parallel all-reduce on this machine's GPUs: the one-shot kernel over peer memory
(octavo/distributed/custom_all_reduce.py) against NCCL, per message size, in one call.

Two processes (one per GPU) check the kernel's sums against NCCL's for several sizes and
dtypes, eagerly and replayed from a CUDA graph with new inputs each time, then time both
inside CUDA graphs (as the engine's decode steps run them). Prints one JSON line.

    python benchmarks/all_reduce.py [--world 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = [4096, 65536, 256 * 4096, 1024 * 4096]  # elements: batch 1 .. 1024 of hidden 4096


def _graph_time_us(fn, reps: int = 50) -> float:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (reps * 10)


def worker(rank: int, world: int, port: int, out_path: str | None) -> None:
    import torch
    import torch.distributed as dist

    from octavo.distributed import parallel_state as ps

    torch.cuda.set_device(rank)
    ps.init_tensor_parallel(rank, world, port, "cuda")
    car = ps._CUSTOM
    assert car is not None, "custom all-reduce not available"
    dev = torch.device("cuda", rank)
    report = {"world": world, "checks": 0, "rows": []}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in SIZES:
            for it in range(3):
                g = torch.Generator(device=dev).manual_seed(1000 * rank + it + n)
                x = torch.randn(n, device=dev, dtype=dtype, generator=g)
                if not car.eligible(x):
                    break
                got = car.all_reduce(x)
                ref = x.clone()
                dist.all_reduce(ref)
                assert torch.equal(got, ref), (dtype, n, (got - ref).abs().max())
                report["checks"] += 1
    # Graph replays with new inputs: the epochs advance on the device.
    x = torch.zeros(256 * 4096, device=dev, dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    car.all_reduce(x)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y = car.all_reduce(x)
    for it in range(20):
        g = torch.Generator(device=dev).manual_seed(7 * it + rank)
        x.copy_(torch.randn(x.shape, device=dev, dtype=x.dtype, generator=g))
        graph.replay()
        ref = x.clone()
        dist.all_reduce(ref)
        assert torch.equal(y, ref), ("graph", it)
        report["checks"] += 1
    for n in SIZES:
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        t_custom = _graph_time_us(lambda x=x: car.all_reduce(x))
        t_nccl = _graph_time_us(lambda x=x: dist.all_reduce(x))
        report["rows"].append({"elements": n, "bytes": 2 * n, "custom_us": round(t_custom, 2),
                               "nccl_us": round(t_nccl, 2),
                               "speedup": round(t_nccl / t_custom, 2)})
    if rank == 0:
        line = json.dumps(report)
        print("RESULT_JSON " + line, flush=True)
        if out_path:
            with open(out_path, "w") as f:
                f.write(line + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args.json), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
