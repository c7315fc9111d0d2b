"""The FP8 GEMV's weight pre-tiled (``_fp8_gemv_kernel``'s TILED), an experiment in how the
weight streams from HBM.

Untiled, each program of ``octavo.kernels.fp8_gemv`` reads per step BLOCK_N row pieces of
BLOCK_K bytes, K bytes apart (gate_up of Llama-8B: 32 pieces of 256 bytes, 4,096 apart).
Tiled, the weight is stored [N / BLOCK_N, K / BLOCK_K, BLOCK_N, BLOCK_K]: a step of a tile is
one contiguous BLOCK_N * BLOCK_K-byte block and a program's whole K range is contiguous. The
rows inside are already in the kernel's tile-column order (GLU's interleaved gate / up, ROPE's
NeoX pairs), so the kernel addresses the weight by local row and step only; the scales stay
per original row. Same products in the same order: the same bits as the untiled kernel.

    w = tile_fp8_weight(weight, *tiled_plan(n, k), glu=True)
    fp8_gemv(x2, w, scale, glu=True, tiled=tiled_plan(n, k))
"""

from __future__ import annotations

import torch

from octavo.kernels.fp8_gemv import _plan


def kernel_rows(n: int, glu: bool = False, rope: tuple[int, int, int] | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """The weight row that ``_fp8_gemv_kernel``'s tile column c reads, for c < n: c; GLU
    ([gate | up], n = 2I): 2p -> p, 2p + 1 -> I + p; ROPE (``rope`` = (num_heads,
    num_kv_heads, head_dim), a [q | k | v] weight): ``qkv_rope_store.rope_rows``, the NeoX
    pair (h * D + i, h * D + i + D/2) of q and k next to each other, v as it is."""
    c = torch.arange(n, device=device)
    assert not (glu and rope), "GLU and ROPE are different weights"
    if glu:
        assert n % 2 == 0, n
        return c // 2 + (c % 2) * (n // 2)
    if rope is not None:
        hq, hkv, d = rope
        assert d % 2 == 0 and n == (hq + 2 * hkv) * d, (n, rope)
        pair = c // 2
        first = (pair // (d // 2)) * d + pair % (d // 2)
        return torch.where(c < (hq + hkv) * d, first + (c % 2) * (d // 2), c)
    return c


def tile_fp8_weight(weight: torch.Tensor, block_n: int, block_k: int, glu: bool = False,
                    rope: tuple[int, int, int] | None = None) -> torch.Tensor:
    """An [N, K] float8 weight as the TILED kernel reads it with tile BLOCK_N x BLOCK_K:
    [N / block_n, K / block_k, block_n, block_k] (contiguous, the same dtype), element
    [t, s, r, j] = weight[kernel_rows(...)[t * block_n + r], s * block_k + j]; a pure
    permutation of the bytes. ``glu`` / ``rope`` as the call that will read it
    (``fp8_gemv(..., glu=True)``, ``fp8_gemv_qkv_rope``). N and K must be multiples of the
    blocks, block_k of 4 (int32 words)."""
    n, k = weight.shape
    assert weight.element_size() == 1, weight.dtype
    assert block_n > 0 and block_k > 0 and block_k % 4 == 0, (block_n, block_k)
    assert n % block_n == 0 and k % block_k == 0, (weight.shape, block_n, block_k)
    rows = kernel_rows(n, glu, rope, device=weight.device)
    b = weight.view(torch.uint8)[rows]  # fancy indexing on bytes: float8 may lack it
    b = b.reshape(n // block_n, block_n, k // block_k, block_k).permute(0, 2, 1, 3)
    return b.contiguous().view(weight.dtype)


def tiled_plan(n: int, k: int) -> tuple[int, int] | None:
    """The (block_n, block_k) of ``fp8_gemv``'s default plan for an [n, k] weight (the
    same for plain, GLU and ROPE calls: the plan looks at the weight's shape only), to tile a
    weight with and pass as ``tiled=``; None where they do not divide (n, k): keep it
    untiled."""
    block_n, block_k = _plan(n, k)[:2]
    if n % block_n or k % block_k:
        return None
    return block_n, block_k
