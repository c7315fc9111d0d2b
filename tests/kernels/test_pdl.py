"""Programmatic dependent launch: when it is on, and a chain of PDL kernels (each reading the
previous one's output) giving the same values as one launched after another, eagerly and
replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import pdl  # noqa: E402


def test_off_on_the_cpu_and_when_asked(monkeypatch):
    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("OCTAVO_PDL", "0")
    assert not pdl.enabled(torch.device("cuda", 0))
    assert pdl.launch_args(torch.device("cuda", 0)) == {"PDL": False}


def _gemm(name):
    from octavo.kernels.dense_gemv import dense_gemv
    from octavo.kernels.skinny_gemm import skinny_gemm

    return {"skinny_gemm": skinny_gemm, "dense_gemv": dense_gemv}[name]


def _chain(x, w_norm, w_up, w_down, gemm="skinny_gemm"):
    """rms_norm -> GEMM -> silu_and_mul -> GEMM -> fused add + rms_norm: each kernel reads
    what the one before it wrote, and writes buffers an earlier one read."""
    from octavo.kernels.activation import silu_and_mul
    from octavo.kernels.rms_norm import fused_add_rms_norm, rms_norm

    h = rms_norm(x, w_norm, 1e-6)
    h = silu_and_mul(_gemm(gemm)(h, w_up))
    h = _gemm(gemm)(h, w_down)
    return fused_add_rms_norm(h, x, w_norm, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,gemm", [(4, "skinny_gemm"), (2, "dense_gemv"), (1, "dense_gemv")])
def test_a_pdl_chain_matches_plain_launches_eagerly_and_in_a_graph(monkeypatch, rows, gemm):
    assert pdl.enabled(torch.device("cuda")), "the H200 (sm_90) runs kernels with PDL"
    g = torch.Generator().manual_seed(0)
    hidden, inter = 1024, 3072
    x = torch.randn(rows, hidden, generator=g).cuda().bfloat16()
    w_norm = torch.rand(hidden, generator=g).cuda().bfloat16()
    w_up = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).cuda().bfloat16()
    w_down = (torch.randn(hidden, inter, generator=g) / inter**0.5).cuda().bfloat16()
    with_pdl = _chain(x, w_norm, w_up, w_down, gemm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _chain(x, w_norm, w_up, w_down, gemm)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=g).cuda().bfloat16())
        graph.replay()
        monkeypatch.setenv("OCTAVO_PDL", "0")
        plain = _chain(x, w_norm, w_up, w_down, gemm)
        monkeypatch.delenv("OCTAVO_PDL")
        torch.cuda.synchronize()
        for a, b in zip(captured, plain, strict=True):
            assert torch.equal(a, b)
    monkeypatch.setenv("OCTAVO_PDL", "0")
    x.copy_(torch.randn(x.shape, generator=g).cuda().bfloat16())
    eager_plain = _chain(x, w_norm, w_up, w_down, gemm)
    monkeypatch.delenv("OCTAVO_PDL")
    eager_pdl = _chain(x, w_norm, w_up, w_down, gemm)
    for a, b in zip(eager_pdl, eager_plain, strict=True):
        assert torch.equal(a, b)
    assert with_pdl[0].shape == (rows, hidden)
