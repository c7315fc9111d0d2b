"""Activations to FP8 (e4m3) for ``torch._scaled_mm`` in one launch: per row (token), the
dynamic scale ``amax(|x|) / 448`` (or a given static scale), then
``fp8(clamp(x / scale, -448, 448))``.

In torch the same takes an abs, an amax, a float32 copy, a divide, a clamp and a cast: six
passes over the activations and six launches per linear layer, which at batch 256 cost more
than the FP8 GEMM saves. Here: one program per row reads it twice (the second pass from cache)
and writes the fp8 row and its scale. The results equal the torch expressions bit for bit:
the division is IEEE round-to-nearest, the cast rounds to nearest even, as torch's does.

``small`` says what a row of zeros (scale 0) gets: "clamp" raises every scale to at least
``min_scale`` (vLLM's rule, ``octavo.quantization.fp8``); "replace" replaces a zero scale by
``min_scale`` and keeps tiny ones (``octavo.quantization.fp8_linear``).
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import next_power_of_2, require_triton, tl, triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@triton.jit
def _fp8_quant_kernel(x_ptr, q_ptr, s_ptr, static_ptr, K, stride_xm, stride_qm, min_scale,
                      STATIC: tl.constexpr, CLAMP_SMALL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xm
    if STATIC:
        scale = tl.load(static_ptr).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.max(amax, axis=0) / 448.0
        if CLAMP_SMALL:
            scale = tl.maximum(scale, min_scale)
        else:
            scale = tl.where(scale > 0, scale, min_scale)
        tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(x_row + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.math.div_rn(x, tl.zeros_like(x) + scale)
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        tl.store(q_ptr + row * stride_qm + k0 + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


def fp8_quant_ref(x2: torch.Tensor, static_scale: torch.Tensor | None, min_scale: float,
                  small: str = "clamp") -> tuple[torch.Tensor, torch.Tensor]:
    """The torch expressions the kernel reproduces: (fp8 [M, K], float32 scales [M, 1])."""
    xf = x2.float()
    if static_scale is not None:
        scale = static_scale.float().reshape(1, 1).expand(x2.shape[0], 1).contiguous()
    else:
        scale = xf.abs().amax(dim=1, keepdim=True) / FP8_MAX
        scale = scale.clamp(min=min_scale) if small == "clamp" else \
            torch.where(scale > 0, scale, torch.full_like(scale, min_scale))
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_quant(x2: torch.Tensor, static_scale: torch.Tensor | None, min_scale: float,
              small: str = "clamp", block: int | None = None, out_dtype: torch.dtype = FP8
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x2`` [M, K] (contiguous rows) -> (fp8 [M, K], float32 scales [M, 1]): per-row dynamic
    scales, or ``static_scale`` (one number) for every row. ``out_dtype=torch.float32`` stores
    the clamped quotients unrounded (the CPU tests: Triton's interpreter converts float32 to
    fp8 incorrectly, so they check the quotients and let torch round them)."""
    require_triton("fp8_quant")
    assert small in ("clamp", "replace"), small
    m, k = x2.shape
    assert x2.stride(1) == 1, x2.stride()
    q = torch.empty(m, k, device=x2.device, dtype=out_dtype)
    if static_scale is not None:
        scales = static_scale.float().reshape(1, 1).expand(m, 1).contiguous()
    else:
        scales = torch.empty(m, 1, device=x2.device, dtype=torch.float32)
    if m == 0:
        return q, scales
    # One step per pass for rows of up to 16K: a program per row, so a short batch's few
    # programs walk their rows in as few dependent loads as the warps allow (Llama-3.1-8B's
    # down input, 16 x 14,336, took 7.1 us in 2,048-wide steps on an H200).
    block = block or min(16384, next_power_of_2(k))
    warps = 16 if block >= 8192 else 8 if block >= 4096 else 4 if block >= 1024 else 2
    _fp8_quant_kernel[(m,)](
        x2, q, scales, scales if static_scale is None else static_scale, k, x2.stride(0),
        q.stride(0), float(min_scale), STATIC=static_scale is not None,
        CLAMP_SMALL=small == "clamp", BLOCK=block, num_warps=warps)
    return q, scales
