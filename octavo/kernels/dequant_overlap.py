"""Large-batch weight-only integer GEMMs on the swap-AB layout as dequantize-then-cuBLAS in
column chunks, the dequantization of the next chunks on a side stream while cuBLAS multiplies
the current one.

Why: past ``SWAPAB_MAX_M`` rows a 4-bit layer dequantizes its whole weight to a bf16 temporary,
then calls cuBLAS (``w4a16_swapab.dequantize_swapab``): the memory-bound dequantization (0.56
bytes a weight read, 2 written) and the GEMM (compute-bound at 256 rows) run one after the
other, about twice a bf16 GEMM's time (H100, one Llama-8B layer at 256 rows: 415 against 205
us; W2 with W4A16 0.83x bf16, issue 12's target 0.9x). Chunks done one after the other were
slower than the whole weight (session 46: the chunks' smaller GEMMs lose more than L2 saves);
overlapped, the sum is about the longer of the two streams' work rather than both.

The chunks' float weights go into a ring of ``buffers`` persistent buffers per (device, dtype,
K, chunk) (fixed addresses: a CUDA graph captures the fork and joins as branches). The side
stream waits for the main stream at the start (the ring's last readers are done), chunk i
waits for the GEMM of chunk i - buffers before overwriting its buffer, and each GEMM waits
for its chunk's dequantization; the main stream has waited for every chunk by the end.

Unmeasured on a GPU when written (session 53): ``OCTAVO_INT_DEQUANT_CHUNK_COLS=N`` turns it on
(``int_weight_layout``); off by default.
"""

from __future__ import annotations

import contextlib

import torch

from octavo.kernels import w4a16_swapab as swapab

BLOCK_ROWS = swapab.ROWS  # int16 rows of a layout block: 64 x (16 / bits) columns
BUFFERS = 2

_RINGS: dict[tuple, list[torch.Tensor]] = {}
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def chunk_columns(n: int, bits: int, chunk: int) -> int:
    """Columns a chunk holds: ``chunk`` rounded down to whole layout blocks (at least one),
    at most ``n``."""
    block = BLOCK_ROWS * (16 // bits)
    return min(n, max(block, chunk // block * block))


def _ring(device: torch.device, dtype: torch.dtype, k: int, cols: int, buffers: int
          ) -> list[torch.Tensor]:
    key = (device, dtype, k, cols, buffers)
    ring = _RINGS.get(key)
    if ring is None:
        ring = [torch.empty(cols, k, device=device, dtype=dtype) for _ in range(buffers)]
        _RINGS[key] = ring
    return ring


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _STREAMS.get(device)
    if stream is None:
        stream = torch.cuda.Stream(device)
        _STREAMS[device] = stream
    return stream


def dequant_gemm(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, bits: int, chunk: int,
                 buffers: int = BUFFERS) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for ``qweight`` in the swap-AB layout (int16 [N / per,
    K]; ``scales`` / ``zeros`` [K / group, N]), in column chunks of about ``chunk`` columns
    whose dequantization runs on a side stream (on CUDA; elsewhere one after the other)."""
    m, k = x2.shape
    per = 16 // bits
    n = qweight.shape[0] * per
    cols = chunk_columns(n, bits, chunk)
    if buffers < 1:
        raise ValueError(f"dequant_gemm: buffers must be at least 1, got {buffers}")
    out = torch.empty(m, n, device=x2.device, dtype=x2.dtype)
    ring = _ring(x2.device, x2.dtype, k, cols, buffers)
    on_cuda = x2.device.type == "cuda"
    if on_cuda:
        main = torch.cuda.current_stream(x2.device)
        side = _side_stream(x2.device)
        side.wait_stream(main)
    gemm_done: list[torch.cuda.Event] = []
    for i, c0 in enumerate(range(0, n, cols)):
        c1 = min(n, c0 + cols)
        buf = ring[i % buffers][: c1 - c0]
        with torch.cuda.stream(side) if on_cuda else contextlib.nullcontext():
            if on_cuda and i >= buffers:
                side.wait_event(gemm_done[i - buffers])  # the GEMM that last read buf
            swapab.dequantize_swapab(qweight[c0 // per:c1 // per], scales[:, c0:c1],
                                     zeros[:, c0:c1], group_size, bits, x2.dtype, out=buf)
        if on_cuda:
            main.wait_event(side.record_event())
        torch.mm(x2, buf.t(), out=out[:, c0:c1])
        if on_cuda:
            gemm_done.append(main.record_event())
    return out
