"""The epilogue of a W8A8 GEMM run with unit scales: ``out[m, n] = acc[m, n] * a[m] * b[n]
(+ bias[n])`` in float32, rounded once to the output dtype, in one launch.

Why: on an H200 ``torch._scaled_mm`` with one scale per operand (cuBLAS) ran Llama-3.1-8B's
projections at 16 rows in 69 us a layer where its row-wise recipe (per-token x per-channel
scales) took 117 and bf16 126 (``benchmarks/fp8_rows_gemm.py``, session 45). So row-scaled
FP8 layers run the unit-scaled GEMM into float32 and apply both scale vectors here: the same
products as the row-wise recipe, rounded once after the scales. For an MLP's merged gate/up
layer the same launch can also apply the gated activation (``glu``), as the GEMV's GLU store
does at 1-2 rows."""

from __future__ import annotations

import torch

from octavo.kernels.activation import silu_mul
from octavo.kernels.triton_utils import require_triton, tl, triton


@triton.jit
def _scaled(acc_ptr, a, b_ptr, bias_ptr, row, cols, ok, stride_am, HAS_BIAS: tl.constexpr):
    """float32 acc[row, cols] * a * b[cols] (+ bias[cols])."""
    acc = tl.load(acc_ptr + row * stride_am + cols, mask=ok, other=0.0).to(tl.float32)
    y = acc * a * tl.load(b_ptr + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return y


@triton.jit
def _outer_scale_kernel(acc_ptr, a_ptr, b_ptr, bias_ptr, out_ptr, N, stride_am, stride_a,
                        stride_om, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    # Grid (M, N tiles); GLU: N is the output's width, half of acc's [gate | up] columns.
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    a = tl.load(a_ptr + row * stride_a)
    y = _scaled(acc_ptr, a, b_ptr, bias_ptr, row, cols, ok, stride_am, HAS_BIAS)
    if GLU:  # each half rounded to the output dtype first, as the projection's store would
        dt = out_ptr.dtype.element_ty
        up = _scaled(acc_ptr, a, b_ptr, bias_ptr, row, N + cols, ok, stride_am, HAS_BIAS)
        y = silu_mul(y.to(dt).to(tl.float32), up.to(dt).to(tl.float32))
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def outer_scale(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype, glu: bool = False
                ) -> torch.Tensor:
    """``acc`` [M, N] (rows contiguous) times ``a`` (float32, [M] or one number) along rows
    and ``b`` (float32 [N]) along columns, plus ``bias`` [N], as ``dtype``. ``glu``: acc
    holds [gate | up] halves; the result [M, N / 2] is ``silu(gate) * up`` of the scaled
    halves, each rounded to ``dtype`` first (``activation.silu_and_mul``'s bits on the
    unfused output), one launch instead of two."""
    require_triton("outer_scale")
    m, n = acc.shape
    a, b = a.reshape(-1), b.reshape(-1)
    assert acc.stride(1) == 1 and a.numel() in (1, m) and b.numel() == n, (
        acc.shape, acc.stride(), a.shape, b.shape)
    assert a.dtype == torch.float32 and b.dtype == torch.float32, (a.dtype, b.dtype)
    assert not glu or n % 2 == 0, n
    width = n // 2 if glu else n
    out = torch.empty(m, width, device=acc.device, dtype=dtype)
    if m == 0 or n == 0:
        return out
    block_n = min(1024, triton.next_power_of_2(width))
    _outer_scale_kernel[(m, triton.cdiv(width, block_n))](
        acc, a, b.contiguous(), bias if bias is not None else b, out, width, acc.stride(0),
        0 if a.numel() == 1 and m > 1 else a.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, GLU=glu, BLOCK_N=block_n, num_warps=4)
    return out


def outer_scale_reference(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                          bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    y = acc.float() * a.reshape(-1, 1).float() * b.reshape(1, -1).float()
    return (y if bias is None else y + bias.float()).to(dtype)
