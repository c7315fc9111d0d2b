"""Activations to FP8 (e4m3) with a dynamic scale per group of columns of each row, in one
launch: the left operand of a block-scaled FP8 GEMM (``torch._scaled_mm``'s 1 x 128 x 128 x 128
recipe, DeepSeek-V3 / Qwen3-FP8 checkpoints' own activation rounding).

Per (row, group): ``scale = amax(|x|) / 448`` (a zero scale, an all-zero group, replaced by
``min_scale``: any positive scale gives zeros), ``q = fp8(clamp(x / scale, -448, 448))``, the
division IEEE round-to-nearest and the cast to nearest even, as the torch expressions of
:func:`fp8_group_quant_ref`. The scales are stored outer-dim-major (``[rows, groups]`` with
the rows contiguous), as cuBLAS reads a 1 x 128 scale operand; ``rows`` may pad M (to a
multiple of 4 for cuBLAS) with zero rows of scale ``min_scale``.
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@triton.jit
def _fp8_group_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sg,
                            min_scale, GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    # Grid (rows, group blocks): BLOCK_G groups of GROUP columns of one row per program.
    row = tl.program_id(0)
    groups = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = (cols < K) & ((cols * 0 + row) < M)  # padding rows (row >= M) read zeros
    x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    scale = tl.max(tl.abs(x), axis=1) / 448.0
    scale = tl.where(scale > 0, scale, min_scale)
    y = tl.math.div_rn(x, tl.zeros_like(x) + scale[:, None])
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    tl.store(q_ptr + row * stride_qm + cols, y.to(q_ptr.dtype.element_ty), mask=cols < K)
    tl.store(s_ptr + groups * stride_sg + row, scale, mask=groups * GROUP < K)


def fp8_group_quant_ref(x2: torch.Tensor, group: int, min_scale: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch expressions the kernel reproduces: (fp8 [M, K], float32 scales [M, G])."""
    m, k = x2.shape
    pad = -k % group
    xf = torch.nn.functional.pad(x2.float(), (0, pad)).view(m, -1, group)
    scale = xf.abs().amax(dim=-1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.full_like(scale, min_scale))
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, -1)[:, :k]
    return q, scale


def fp8_group_quant(x2: torch.Tensor, group: int, min_scale: float, rows: int | None = None,
                    out_dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """``x2`` [M, K] (contiguous rows) -> (q [rows, K], float32 scales [rows, ceil(K / group)]
    stored rows-contiguous); ``rows`` (>= M, default M) pads with zero rows.
    ``out_dtype=torch.float32`` stores the clamped quotients unrounded (Triton's interpreter
    converts float32 to fp8 incorrectly: the CPU tests let torch round them)."""
    require_triton("fp8_group_quant")
    m, k = x2.shape
    rows = m if rows is None else rows
    assert rows >= m and x2.stride(1) == 1 and group & (group - 1) == 0, (rows, m, group)
    groups = -(-k // group)
    q = torch.empty(rows, k, device=x2.device, dtype=out_dtype)
    scales = torch.empty(groups, rows, device=x2.device, dtype=torch.float32).t()
    if rows == 0:
        return q, scales
    block_g = max(1, min(next_power_of_2(groups), 4096 // group))
    _fp8_group_quant_kernel[(rows, triton.cdiv(groups, block_g))](
        x2, q, scales, m, k, x2.stride(0), q.stride(0), scales.stride(1), float(min_scale),
        GROUP=group, BLOCK_G=block_g, num_warps=4)
    return q, scales
