"""Decode attention (one new token per request) over the paged KV cache in CUDA C++
(``octavo/kernels/cuda/paged_decode.cu``): the decode launch of
:func:`octavo.kernels.paged_attention.paged_attention` on NVIDIA GPUs where it applies.

Why: the Triton decode kernel waits on each K/V tile before it asks for the next (its
pipeliner does not overlap the block-table gather with the dots), so a program has one tile
in flight; three programs per SM hide that at W1's long contexts (77% of HBM at batch 128 x
~1,000 tokens on an H200) but not at W4's batch 32 x ~300 tokens (24%), where each program
walks only three tiles. Here every warp streams its own 16-token tiles through a ring of
``stages`` shared-memory slots with ``cp.async`` (``stages - 1`` tiles in flight while it
computes one), the products run on ``mma.sync`` with the GQA group's heads as rows, and a
context is cut into parts (merged in the launch by the part that finishes last, as
``octavo.kernels.split_k`` does for GEMMs) when the (request, KV head) pairs cannot fill the
GPU.

Applies to bf16 / fp16 caches of q's own dtype (not ``kv_cache_dtype="fp8"``), head_dim 64
or 128, GQA groups of up to 16 heads, cache blocks a multiple of 16 tokens and 16-byte
aligned rows; everything else keeps the Triton kernel. ``OCTAVO_CUDA_ATTENTION=1`` switches it
on (off by default until it measures faster than the Triton kernel in the engine).
"""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from octavo import envs
from octavo.kernels import cuda_module
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "paged_decode.cu"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
HEAD_DIMS = (64, 128)
MAX_GROUP = 16
STAGES = (2, 3, 4, 6, 8)
MAX_WARPS = 8
SHARED_LIMIT = 227 * 1024  # dynamic shared memory one CTA may have (sm_90)
# Default tile: 4 warps with 3 stages (96 KB of shared memory at head_dim 128: two CTAs per
# SM, four tiles in flight per warp pair).
DEFAULT_WARPS = 4
DEFAULT_STAGES = 3


class _Params(ctypes.Structure):
    # cuda/paged_decode.cu's Params, field for field.
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "out", "q", "k_cache", "v_cache", "qsl", "seq_lens", "block_tables", "part_o",
        "part_ml", "cnt")] + [("qk_scale", ctypes.c_float)] + [(name, ctypes.c_int) for name in (
            "q_t", "q_h", "o_t", "o_h", "k_b", "k_t", "k_h", "v_b", "v_t", "v_h", "bt_stride",
            "group", "block_size", "min_part", "flags")]


@dataclasses.dataclass(frozen=True)
class Plan:
    warps: int  # per CTA
    stages: int  # tiles in each warp's ring
    splits: int  # parts of a context at most (grid z)
    min_part: int  # tokens: no part shorter (a multiple of 16)

    def shared_bytes(self, head_dim: int) -> int:
        return self.warps * self.stages * (head_dim // 8) * 512


def supported(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
              query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
              block_tables: torch.Tensor) -> bool:
    """Whether the CUDA kernel takes this decode launch (shapes, dtypes and alignment only)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if q.dtype not in _DTYPES or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        return False
    if head_dim not in HEAD_DIMS or block_size % 16 or num_heads // num_kv_heads > MAX_GROUP:
        return False
    for t in (query_start_loc, seq_lens, block_tables):
        if t.dtype != torch.int32 or t.stride(-1) != 1:
            return False
    for t in (q, key_cache, value_cache):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
            return False
    return True


def takes(num_seqs: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a decode launch of ``num_seqs`` requests is this kernel's: at least one
    (request, KV head) pair per SM (envs.cuda_attention_min_pairs overrides). Fewer pairs
    need their contexts split, and there the Triton kernel's short parts merged by a second
    launch were faster (docs/benchmarks.md, session 23)."""
    least = envs.cuda_attention_min_pairs()
    if least is None:
        least = num_compute_units(device)
    return num_seqs * num_kv_heads >= least


def plan(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device,
         head_dim: int = 128) -> Plan:
    """The launch: ``envs.cuda_attention_tile`` / ``cuda_attention_part`` override the tile
    and the part length (measurements); otherwise a context is split only when the pairs
    are fewer than the SMs, into parts of at least one tile per warp, about two CTAs per
    SM."""
    warps, stages = envs.cuda_attention_tile() or (DEFAULT_WARPS, DEFAULT_STAGES)
    while warps > 1 and Plan(warps, stages, 1, 16).shared_bytes(head_dim) > SHARED_LIMIT:
        warps //= 2
    tile_keys = 16 * warps
    part = envs.cuda_attention_part()
    if part is not None:
        part = max(16, -(-part // 16) * 16)
        return Plan(warps, stages, max(1, -(-max_seq_len // part)), part)
    pairs = max(1, num_seqs * num_kv_heads)
    sms = num_compute_units(device)
    splits = 1
    if pairs < sms:
        splits = max(1, min(-(-2 * sms // pairs), -(-max_seq_len // tile_keys), 64))
    return Plan(warps, stages, splits, tile_keys)


def kernel_name(dtype: torch.dtype, head_dim: int, stages: int, group: int) -> str:
    return (f"paged_decode_{_DTYPES[dtype]}_d{head_dim}_s{stages}"
            + ("_g16" if group > 8 else ""))


def paged_decode(out: torch.Tensor, q: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, query_start_loc: torch.Tensor,
                 seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                 max_seq_len: int, module: cuda_module.Module, p: Plan | None = None) -> None:
    """Write the attention of every decode request (one new token) of the batch into
    ``out`` (``[T, H, D]``); requests with other query lengths are left alone. Arguments as
    :func:`octavo.kernels.paged_attention.paged_attention`'s; ``max_seq_len`` bounds every
    ``seq_lens`` entry (it sizes the split)."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    if p is None:
        p = plan(num_seqs, num_kv_heads, max_seq_len, q.device, head_dim)
    pairs = num_seqs * num_kv_heads
    if p.splits > 1:
        f32 = dict(dtype=torch.float32, device=q.device)
        part_o = torch.empty(pairs * p.splits * group * head_dim, **f32)
        part_ml = torch.empty(pairs * p.splits * group * 2, **f32)
        cnt = split_k_counters(q.device, pairs)
    else:
        part_o = part_ml = cnt = None
    params = _Params(
        out.data_ptr(), q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        query_start_loc.data_ptr(), seq_lens.data_ptr(), block_tables.data_ptr(),
        None if part_o is None else part_o.data_ptr(),
        None if part_ml is None else part_ml.data_ptr(),
        None if cnt is None else cnt.data_ptr(),
        float(scale) * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), group, block_size, p.min_part, envs.cuda_attention_flags())
    grid = (num_seqs, num_kv_heads, p.splits)
    if params.flags & 4 and num_kv_heads <= MAX_WARPS:  # a CTA per request and part, a warp
        p = dataclasses.replace(p, warps=num_kv_heads)  # per KV head
        if p.shared_bytes(head_dim) > SHARED_LIMIT:
            p = dataclasses.replace(p, stages=2)
        grid = (num_seqs, 1, p.splits)
    else:
        params.flags &= ~4
    module.launch(kernel_name(q.dtype, head_dim, p.stages, group), grid, 32 * p.warps,
                  [params], pdl=pdl_mod.enabled(q.device), shared=p.shared_bytes(head_dim))


def module_for(device: torch.device) -> cuda_module.Module | None:
    """The built kernels on ``device`` when the switch is on, else None."""
    if not envs.cuda_attention():
        return None
    return cuda_module.module(SOURCE, device)
