"""Stream-K decode attention in CUDA C++ (``octavo/kernels/cuda/streamk_attention.cu``): the
work list of :mod:`octavo.kernels.paged_attention_streamk` walked by CTAs whose warps keep
their own ``cp.async`` rings of K / V, the products on ``mma.sync``.

Why: the Triton stream-K kernel reads W1's KV cache at 77-81% of the H200's HBM bandwidth
(docs/benchmarks.md sessions 27, 40), and attention is most of W1's large-batch steps (4.07
of 5.22 ms at batch 128). Its TTGIR waits for all of a tile's copies at the loop's top and
issues the next tile's only after its dots, one buffer deep: a program overlaps nothing with
itself, and two programs per SM (255 registers) leave the memory system idle between tiles.
Here each of a CTA's 4 (or 8) warps takes 16 keys of every tile (BLOCK_N = 16 x warps) and
copies them ``stages - 1`` tiles ahead into its own ring (8 KB a stage: K and V of 16 keys,
head_dim 128), waiting only on its own copies (no CTA barrier in the loop); the warps'
softmax states meet in shared memory at request boundaries. Two CTAs per SM keep 64-128 KB
of K / V in flight per SM.

Unmeasured on a GPU when written (session 53): ``OCTAVO_ATTN_CUDA=1`` turns it on for the
decode-only steps stream-K takes (bf16 / fp16 KV of the query's dtype, head_dim 128, GQA
groups of 1, 2, 4 or 8, cache blocks of 16, 32 or 64 keys); the Triton kernel stays the
default until the GPU measures this one.
"""

from __future__ import annotations

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "streamk_attention.cu"
HEAD_DIMS = (128,)
GROUPS = (1, 2, 4, 8)
BLOCK_SIZES = (16, 32, 64)
# (warps, stages) built; registers (ptxas, sm_90): 185 / 162-164 / 160-162, no spills.
BUILT = frozenset({(4, 2), (4, 3), (8, 2)})
WARPS = 4
STAGES = 3
CTAS_PER_SM = 2  # the grid's aim: 4 warps x 185 registers and 102-115 KB of shared memory
BLOCK_N = 16 * WARPS  # keys of a work-list tile at the default plan
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
_LOG2E = 1.4426950408889634


def supports(dtype: torch.dtype, kv_dtype: torch.dtype, group: int, head_dim: int,
             block_size: int, warps: int = WARPS) -> bool:
    return (dtype in _DTYPES and kv_dtype == dtype and group in GROUPS and head_dim in HEAD_DIMS
            and block_size in BLOCK_SIZES and (16 * warps) % block_size == 0)


def available(device: torch.device) -> bool:
    """Built (nvcc, an NVIDIA GPU) and not turned off (``OCTAVO_CUDA_KERNELS=0``)."""
    return envs.cuda_kernels() and cuda_module.module(SOURCE, device) is not None


def applies(q: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """Whether the engine's stream-K decode runs here: ``OCTAVO_ATTN_CUDA`` on, the shapes
    supported, the kernels built (q ``[tokens, heads, head_dim]``, key_cache ``[blocks,
    block_size, kv heads, head_dim]``)."""
    if not envs.attn_cuda() or q.device.type != "cuda":
        return False
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    group = q.shape[1] // num_kv_heads
    return (supports(q.dtype, key_cache.dtype, group, head_dim, block_size)
            and available(q.device))


def shared_bytes(head_dim: int, group: int, warps: int, stages: int) -> int:
    """cuda/streamk_attention.cu's shared_bytes: the warps' rings (K and V of 16 keys a
    stage) and the merge area (acc, m, l of each warp's rows)."""
    return warps * stages * 2 * 16 * head_dim * 2 + warps * group * (head_dim + 2) * 4


def num_programs(device: torch.device, num_kv_heads: int, ctas_per_sm: int = CTAS_PER_SM
                 ) -> int:
    """P, the grid's first axis: about ``ctas_per_sm`` CTAs per SM over all KV heads."""
    return max(1, ctas_per_sm * num_compute_units(device) // num_kv_heads)


def streamk_decode_cuda(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        query_start_loc: torch.Tensor, tiles, scale: float, out: torch.Tensor,
                        *, programs: int | None = None, warps: int = WARPS,
                        stages: int = STAGES) -> torch.Tensor:
    """Decode attention of the rows in ``tiles`` (a
    :class:`octavo.kernels.paged_attention_streamk.DecodeTiles` with ``block_n`` 16 x
    ``warps``) into ``out``, as ``streamk_decode`` does. ``programs``, ``warps``,
    ``stages``: the launch plan (the benchmarks' sweep)."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    if not supports(q.dtype, key_cache.dtype, group, head_dim, block_size, warps) or \
            value_cache.dtype != key_cache.dtype or (warps, stages) not in BUILT:
        raise ValueError(f"streamk_decode_cuda: {q.dtype} q, {key_cache.dtype} KV, group "
                         f"{group}, head_dim {head_dim}, blocks of {block_size}, {warps} warps "
                         f"x {stages} stages is not supported")
    if tiles.block_n != 16 * warps or tiles.block_size != block_size:
        raise ValueError(f"streamk_decode_cuda: the work list's tiles of {tiles.block_n} keys "
                         f"(blocks of {tiles.block_size}) are not {warps} warps' {16 * warps}")
    for t in (q, out, key_cache, value_cache):
        assert t.stride(-1) == 1 and max(t.stride()) < 2**31  # C int strides
    assert out.shape == q.shape and q.stride(1) % 2 == 0 and q.stride(0) % 2 == 0
    num_seqs = tiles.order.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    progs = programs or num_programs(q.device, num_kv_heads)
    f32 = dict(dtype=torch.float32, device=q.device)
    part_acc = torch.empty((progs, 2, num_kv_heads, group, head_dim), **f32)
    part_ml = torch.empty((progs, 2, num_kv_heads, group, 2), **f32)
    cnt = split_k_counters(q.device, num_seqs * num_kv_heads)
    mod = cuda_module.loaded(SOURCE, q.device)
    name = f"streamk_attention_{_DTYPES[q.dtype]}_d{head_dim}_g{group}_w{warps}_p{stages}"
    args = cuda_module.arguments(
        out, q, key_cache, value_cache, tiles.cu_tiles, tiles.order, tiles.tile_tok,
        tiles.tile_info, tiles.tile_req, tiles.tile_blocks, part_acc, part_ml, cnt,
        query_start_loc, float(scale) * _LOG2E, num_seqs, progs, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), key_cache.stride(0), key_cache.stride(1),
        key_cache.stride(2), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_size)
    mod.launch(name, (progs, num_kv_heads, 1), 32 * warps, args,
               pdl=pdl_mod.enabled(q.device),
               shared_bytes=shared_bytes(head_dim, group, warps, stages))
    return out

