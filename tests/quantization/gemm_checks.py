"""Shared checks of the integer GEMM tests: relative error, and replays of a CUDA graph."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def check_graph_replays(run, ref, x: torch.Tensor, tol: float = 1e-2) -> None:
    """``run(x)`` captured in a CUDA graph (compiled once outside the capture) matches
    ``ref(x)`` replay after replay with new x, and leaves the split-K counters zeroed (the
    engine replays decode steps as graphs)."""
    from octavo.kernels import split_k

    run(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(x)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref(x)) < tol
        assert not split_k.counters(x.device, 1).any()


def record_rows(monkeypatch, module, name: str) -> list[int]:
    """Wrap ``module.name`` (a GEMM taking x first) so that every call appends x's row count to
    the returned list: which batches a routing sent there."""
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name,
                        lambda x, *a, **kw: calls.append(x.shape[0]) or real(x, *a, **kw))
    return calls
