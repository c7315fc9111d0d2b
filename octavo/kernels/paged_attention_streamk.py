"""Stream-K decode attention: the decodes' KV tiles of a whole batch shared evenly by a fixed
grid of programs (issue 15).

The one-program-per-(request, KV head) decode launch of :mod:`octavo.kernels.paged_attention`
pays a fixed cost per program (prologue, q load, epilogue) and, with contexts of mixed
lengths, ends on an unbalanced tail: on an H200 at batch 256 it reaches 88% of HBM bandwidth
on 2,048-key contexts but 54% on 128-key ones and 76% on W1's mix. Here:

* Work units: each decode's KV range ``[0, seq_len)`` in tiles of BLOCK_N keys. The requests
  are taken in a given order (longest first, or the batch's own), requests with no tile (not
  a decode: prefill chunks, empty rows) moved to the end; ``cu_tiles`` (int32 ``[B+1]``) is
  the exclusive prefix sum of the tiles in that order. With them the work list holds, per
  flattened tile, its request's q / output row, its valid keys and first / last flags, its
  request's position, and the cache blocks its keys lie in (copied from the step's block
  table), in arrays sized on the host (every request at the block table's reach or
  ``max_seq_len``). All of it is built on the device by one launch of one program per
  request once per step (:func:`decode_tiles`; a captured graph rebuilds it at each replay)
  and shared by every layer.
* Grid ``(P, num_kv_heads)``, P from the host only (``waves`` x SMs / KV heads), so a CUDA
  graph can capture it. Program ``p`` takes tiles ``[p * per, min((p + 1) * per, total))``
  with ``per = cdiv(total, P)``; programs past the end exit.
* A program walks its tiles in one loop whose every load address is the tile index's, or
  one gather from the work list at that index (K/V through the tile's block ids), as in the
  per-request kernel: nothing carried from the previous tile feeds an address, so the next
  tile's K/V copies are issued a stage ahead (cp.async on sm_90) across request boundaries.
  At a request's first tile the softmax state is reset; at its last tile (or the program's
  last: a branch the middle tiles skip) the state is stored: normalised into the output when
  the program covered the whole request, else as a partial (acc, max, sum) in scratch slot 0
  (the request the program starts inside) or 1 (the one it ends inside) -- only those two
  can be cut, every request between them is whole.
* Cut requests merge in the same launch: after its loop a program takes a ticket from its cut
  requests' (request, KV head) counters (:func:`octavo.kernels.split_k.counters`, left zeroed);
  the last piece's program merges the pieces (programs ``start // per`` to
  ``(end - 1) // per`` cover a request's tiles ``[start, end)``), writes the output and resets
  the counter.

Measured on an H200 (session 27, docs/benchmarks.md): W1's decode attention 162.2 -> 153.0 us
(81% of HBM), 128-key contexts at batch 256 51.2 -> 41.0 us, 2,048-key ones even; W1's decode
steps 3.2% faster, W2's 1.4%. W4's batch 32 (256 programs, short contexts) was slower, so the
backend takes this launch for grids of two (request, KV head) programs per SM or more.

A CUDA C++ port of this walk (session 53, 31fe1a6 / 0018126, removed): each warp of a CTA took
16 keys of every 64-key tile through its own ``cp.async`` ring, products on ``mma.sync``.
Correct, but slower on an H100 at every shape: W1 batch 256 418 against 393 us (81% against
86.5% of HBM), batch 16 50.7 against 48.7, W4's batch 32 24.4 against 20.7; three stages
slower than two (not short of copies in flight); W1 18,776 against 19,940 tok/s.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from octavo.envs import attn_decode_tile, attn_streamk_tile, attn_streamk_waves
from octavo.kernels.online_softmax import pv_dot, softmax_step
from octavo.kernels.paged_attention_config import _Config, _pick_config, with_tile
from octavo.kernels.pdl import begin as pdl_begin
from octavo.kernels.pdl import launch_args as pdl_args
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import next_power_of_2, num_compute_units, tl, triton

_LOG2E = 1.4426950408889634
_FP8_KV = (torch.float8_e4m3fn,)
# Programs per SM over all KV heads (P = waves x SMs // KV heads). Two: the kernel compiled
# for sm_90 (bf16, head_dim 128, BLOCK_N 128, 4 warps) holds 255 registers per thread, so
# two programs fit an SM at once (as for the per-request launch): the whole grid is resident
# in one wave, each program's share of the tiles equal.
DEFAULT_WAVES = 2
STAGES = 3  # software-pipeline stages on the GPU (streamk_config)
# Keys per tile of a launch with at most one (request, KV head) pair per SM (``small_grid``):
# shorter tiles, more of them to share. H100 (session 60, one run each, ms per token, 128 /
# 64 keys): Llama-8B W4A16 batch 16 3.347 / 3.231 (GQA 4; batch 32, 256 pairs, 4.747 /
# 4.733), Qwen3-0.6B batch 8 / 16 1.152 / 1.133 and 1.406 / 1.399 (GQA 2). The split launch
# takes 64 for the same grids (paged_attention_config._SPLIT_DECODE_BLOCK_N, H200). Two
# stages there, not three (H100, session 61, one run each, ms per token, 64 keys at 3 / 2
# stages): Llama-8B W4A16 batch 16 3.225 / 3.193, Qwen3-0.6B batch 16 1.407 / 1.381 (128
# keys: 3.342, 1.414; 32 keys: 3.250, 1.434; 64 keys on 8 warps: 3.207, 1.401).
SMALL_GRID_BLOCK_N = 64
SMALL_GRID_STAGES = 2


class DecodeTiles(NamedTuple):
    """A step's stream-K work list, shared by every layer.

    ``cu_tiles`` int32 ``[B+1]``: the tiles of the requests in ``order``, exclusive prefix
    sum; ``order`` int32 ``[B]``: a permutation of the requests, those without tiles last.
    Per flattened tile ``t`` (first ``cu_tiles[B]`` entries valid, the arrays sized on the
    host: ``capacity`` tiles): ``tile_tok[t]`` its request's q / output row,
    ``tile_info[t]`` its valid keys (1..block_n, bits 0-15) | first tile of its request
    (bit 16) | last (bit 17) | the tile's first key's offset inside its cache block (bits
    18-, zero when ``block_n`` is a multiple of ``block_size``), ``tile_req[t]`` its
    request's position in ``order``, ``tile_blocks[t]`` (``[capacity, blocks_per_tile]``)
    the physical cache blocks its keys lie in (copied from the block table: rebuilt each
    step). ``block_n`` and ``block_size`` must be the launch's."""

    cu_tiles: torch.Tensor
    order: torch.Tensor
    block_n: int
    tile_tok: torch.Tensor
    tile_info: torch.Tensor
    tile_req: torch.Tensor
    tile_blocks: torch.Tensor
    block_size: int


# tile_info's fields.
KEYS_MASK = 0xFFFF
FIRST_BIT = 16
LAST_BIT = 17
OFFSET_SHIFT = 18
# The same for the kernels, which read module globals only as constexprs.
_KEYS_MASK = tl.constexpr(KEYS_MASK)
_FIRST_BIT = tl.constexpr(FIRST_BIT)
_LAST_BIT = tl.constexpr(LAST_BIT)
_OFFSET_SHIFT = tl.constexpr(OFFSET_SHIFT)


def blocks_per_tile(block_n: int, block_size: int) -> int:
    """Cache blocks a tile of ``block_n`` keys can touch: ``block_n // block_size`` when the
    tiles start on block boundaries (``block_n`` a multiple of ``block_size``), else enough
    for a tile starting anywhere inside a block."""
    if block_n % block_size == 0:
        return block_n // block_size
    return (block_n + block_size - 2) // block_size + 1


def tile_capacity(num_seqs: int, block_tables: torch.Tensor, block_size: int, block_n: int,
                  max_seq_len: int | None = None) -> int:
    """Flattened tiles the work list has room for, from host facts only: every request at
    the longest context the block table can address (``max_seq_len``, if given, tightens
    it: it must bound every ``seq_lens`` entry, in a CUDA graph every replay's)."""
    kv_upper = block_tables.shape[1] * block_size
    if max_seq_len is not None:
        kv_upper = min(kv_upper, max_seq_len)
    return max(1, num_seqs * -(-kv_upper // block_n))


def small_grid(num_seqs: int, num_kv_heads: int, units: int) -> bool:
    """Whether a stream-K launch over ``num_seqs`` requests has at most one (request, KV
    head) pair per SM of the device's ``units``, where its tiles are ``SMALL_GRID_BLOCK_N``
    keys long."""
    return num_seqs * num_kv_heads <= units


def streamk_config(group: int, head_dim: int, dtype: torch.dtype, on_gpu: bool,
                   small: bool = False) -> _Config:
    """The stream-K launch's tile: the decode launch's with three stages on the GPU (on an
    H200, W1's attention 161.6 us at two stages, 154.7 at three; the per-request launch
    keeps two), at most ``SMALL_GRID_BLOCK_N`` keys in ``SMALL_GRID_STAGES`` stages where
    ``small`` (:func:`small_grid`);
    OCTAVO_ATTN_STREAMK_TILE, else OCTAVO_ATTN_DECODE_TILE, overrides all of it."""
    head_dim_p = max(16, next_power_of_2(head_dim))
    elem = torch.empty((), dtype=dtype).element_size()
    cfg = _pick_config(True, group, head_dim_p, elem, on_gpu)
    tile = (attn_streamk_tile() or attn_decode_tile()) if on_gpu else None
    if tile is not None:
        return with_tile(cfg, tile)
    if on_gpu:
        if small:
            cfg = _Config(cfg.block_q, cfg.block_m, min(cfg.block_n, SMALL_GRID_BLOCK_N),
                          cfg.num_warps, SMALL_GRID_STAGES)
        else:
            cfg = _Config(cfg.block_q, cfg.block_m, cfg.block_n, cfg.num_warps, STAGES)
    return cfg


def batch_config(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> _Config:
    """:func:`streamk_config` for a launch over ``num_seqs`` requests on ``device``, with
    the small-grid tile where :func:`small_grid` holds on the GPU: the one derivation the
    attention backend (its work list's BLOCK_N) and :func:`streamk_decode` share."""
    on_gpu = device.type == "cuda"
    small = on_gpu and small_grid(num_seqs, num_kv_heads, num_compute_units(device))
    return streamk_config(num_heads // num_kv_heads, head_dim, dtype, on_gpu, small)


def decode_tiles(query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 block_tables: torch.Tensor, block_size: int, block_n: int,
                 order: torch.Tensor | None = None, *,
                 max_seq_len: int | None = None) -> DecodeTiles:
    """The stream-K work list of a batch, in one launch of one program per request (no sync,
    capturable). Requests with exactly one new token have ``cdiv(seq_len, block_n)`` tiles,
    the rest none; those without tiles are moved behind the others (stably), so a program's
    walk steps from one request to the next by one. ``order``: the requests' order
    (default: the batch's). Sized by :func:`tile_capacity` (``max_seq_len`` as there)."""
    num_seqs = seq_lens.shape[0]
    device = seq_lens.device
    i32 = dict(dtype=torch.int32, device=device)
    cap = tile_capacity(num_seqs, block_tables, block_size, block_n, max_seq_len)
    bpt = blocks_per_tile(block_n, block_size)
    cu = torch.empty(num_seqs + 1, **i32)
    out_order = torch.empty(num_seqs, **i32)
    tile_tok = torch.empty(cap, **i32)
    tile_info = torch.empty(cap, **i32)
    tile_req = torch.empty(cap, **i32)
    tile_blocks = torch.empty((cap, bpt), **i32)
    if order is not None:
        assert order.shape == (num_seqs,) and order.dtype == torch.int32
    assert block_tables.shape[0] == num_seqs and block_tables.stride(-1) == 1
    _work_list_kernel[(max(1, num_seqs),)](
        query_start_loc, seq_lens, seq_lens if order is None else order, block_tables, cu,
        out_order, tile_tok, tile_info, tile_req, tile_blocks, num_seqs, cap,
        block_tables.stride(0),
        BLOCK_N=block_n, BLOCK_SIZE=block_size, BPT=bpt, BPT_P=next_power_of_2(bpt),
        BLOCK=max(16, next_power_of_2(num_seqs)), CHUNK=max(1, 256 // next_power_of_2(bpt)),
        ORDER=order is not None, **pdl_args(device),
    )  # fmt: skip
    return DecodeTiles(cu, out_order, block_n, tile_tok, tile_info, tile_req, tile_blocks,
                       block_size)


def decode_tiles_ref(query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                     block_tables: torch.Tensor, block_size: int, block_n: int,
                     order: torch.Tensor | None = None) -> DecodeTiles:
    """:func:`decode_tiles` in torch ops and Python loops (a host sync), for tests: the
    per-tile arrays hold exactly the ``cu_tiles[B]`` valid tiles."""
    num_seqs = seq_lens.shape[0]
    device = seq_lens.device
    if order is None:
        order = torch.arange(num_seqs, dtype=torch.int32, device=device)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    tiles = torch.where(q_lens == 1, (seq_lens + (block_n - 1)) // block_n, 0)
    tiles = tiles[order.long()]
    keep = torch.argsort((tiles == 0).to(torch.int32), stable=True)
    order = order[keep].to(torch.int32)
    cu = torch.zeros(num_seqs + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(tiles[keep], 0)
    bpt = blocks_per_tile(block_n, block_size)
    tok, info, req, blocks = [], [], [], []
    qsl, sl, bt = query_start_loc.tolist(), seq_lens.tolist(), block_tables.tolist()
    for j, b in enumerate(order.tolist()):
        n_tiles = int(cu[j + 1] - cu[j])
        for k in range(n_tiles):
            key0 = k * block_n
            keys = min(sl[b] - key0, block_n)
            info.append(keys | (k == 0) << FIRST_BIT | (k == n_tiles - 1) << LAST_BIT
                        | (key0 % block_size) << OFFSET_SHIFT)
            tok.append(qsl[b])
            req.append(j)
            used = -(-sl[b] // block_size)
            first = key0 // block_size
            blocks.append([bt[b][first + c] if first + c < used else 0 for c in range(bpt)])
    i32 = dict(dtype=torch.int32, device=device)
    return DecodeTiles(cu, order, block_n, torch.tensor(tok, **i32), torch.tensor(info, **i32),
                       torch.tensor(req, **i32),
                       torch.tensor(blocks, **i32).reshape(len(tok), bpt), block_size)


def num_programs(device: torch.device, num_kv_heads: int, waves: int | None = None) -> int:
    """P, the grid's first axis: about ``waves`` programs per SM over all KV heads
    (OCTAVO_ATTN_STREAMK_WAVES, else DEFAULT_WAVES)."""
    if waves is None:
        waves = attn_streamk_waves() or DEFAULT_WAVES
    return max(1, waves * num_compute_units(device) // num_kv_heads)


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_seqs", "capacity", "stride_bt"])
def _work_list_kernel(qsl_ptr, seq_lens_ptr, order_in_ptr, bt_ptr, cu_ptr, order_ptr,
                      tile_tok_ptr, tile_info_ptr, tile_req_ptr, tile_blocks_ptr, num_seqs,
                      capacity, stride_bt, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      BPT: tl.constexpr, BPT_P: tl.constexpr, BLOCK: tl.constexpr,
                      CHUNK: tl.constexpr, ORDER: tl.constexpr, PDL: tl.constexpr):
    """Program j: every request's tiles in the given order, those with tiles first (stable
    partition by two prefix sums), and the tiles' exclusive prefix sum (program 0 stores
    them); then the per-tile arrays of the request at position j."""
    pdl_begin(PDL)
    j = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < num_seqs
    if ORDER:
        b = tl.load(order_in_ptr + offs, mask=ok, other=0)
    else:
        b = offs
    q_len = tl.load(qsl_ptr + b + 1, mask=ok, other=0) - tl.load(qsl_ptr + b, mask=ok, other=0)
    seq_len = tl.load(seq_lens_ptr + b, mask=ok, other=0)
    tiles = tl.where(ok & (q_len == 1), (seq_len + BLOCK_N - 1) // BLOCK_N, 0)
    has = (tiles > 0).to(tl.int32)
    # Padding lanes (past num_seqs) count as empty and come after every real one.
    pos = tl.where(has > 0, tl.cumsum(has, 0) - 1, tl.sum(has, 0) + tl.cumsum(1 - has, 0) - 1)
    # Empty requests add nothing, so a request with tiles ends where its running sum does.
    ends = tl.where(has > 0, tl.cumsum(tiles, 0), tl.sum(tiles, 0))
    if j == 0:
        tl.store(order_ptr + pos, b, mask=ok)
        tl.store(cu_ptr + pos + 1, ends, mask=ok)
        tl.store(cu_ptr + offs, offs * 0, mask=offs == 0)

    # The request at position j: its tiles [start, start + n_tiles) of the walk.
    sel = ok & (pos == j)
    bj = tl.sum(tl.where(sel, b, 0), 0)
    n_tiles = tl.sum(tl.where(sel, tiles, 0), 0)
    start = tl.sum(tl.where(sel, ends, 0), 0) - n_tiles
    if n_tiles > 0:
        tok = tl.load(qsl_ptr + bj)
        len_j = tl.load(seq_lens_ptr + bj)
        used = (len_j + BLOCK_SIZE - 1) // BLOCK_SIZE  # the block table's entries in use
        bt_row = bt_ptr + bj.to(tl.int64) * stride_bt
        offs_c = tl.arange(0, CHUNK)
        offs_b = tl.arange(0, BPT_P)
        for c in range(0, n_tiles, CHUNK):
            k = c + offs_c  # tile index within the request
            t = start + k
            # Past the host-sized capacity only if seq_lens broke its bound: never write there.
            w_ok = (k < n_tiles) & (t < capacity)
            key0 = k * BLOCK_N
            keys = tl.minimum(len_j - key0, BLOCK_N)
            info = (keys | ((k == 0).to(tl.int32) << _FIRST_BIT)
                    | ((k == n_tiles - 1).to(tl.int32) << _LAST_BIT)
                    | ((key0 % BLOCK_SIZE) << _OFFSET_SHIFT))
            tl.store(tile_tok_ptr + t, tok + offs_c * 0, mask=w_ok)
            tl.store(tile_info_ptr + t, info, mask=w_ok)
            tl.store(tile_req_ptr + t, j + offs_c * 0, mask=w_ok)
            idx = (key0 // BLOCK_SIZE)[:, None] + offs_b[None, :]
            b_ok = w_ok[:, None] & (offs_b < BPT)[None, :]
            # Blocks past the context read as 0 (their keys are masked): a full row, so the
            # attention loop loads it without a mask.
            blk = tl.load(bt_row + idx, mask=b_ok & (idx < used), other=0)
            tl.store(tile_blocks_ptr + t.to(tl.int64)[:, None] * BPT + offs_b[None, :], blk,
                     mask=b_ok)


@triton.jit
def _merge_pieces(out_ptr, part_acc_ptr, part_ml_ptr, cnt_ptr, order_ptr, qsl_ptr, i,
                  start, end, per, kv_head, num_kv_heads, stride_ot, stride_oh, offs_m,
                  row_ok, head, offs_d, d_ok, BLOCK_M: tl.constexpr,
                  HEAD_DIM_P: tl.constexpr, MERGE_UNROLL: tl.constexpr = 4):
    """This program's partial of request ``i`` (tiles ``[start, end)`` in walk order) is
    written: take a ticket; the last of its pieces merges them all into the output and
    resets the counter."""
    b = tl.load(order_ptr + i)
    p_first = start // per
    p_last = (end - 1) // per
    cnt = cnt_ptr + b * num_kv_heads + kv_head
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
    if ticket == p_last - p_first:
        m_all = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_all = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc_all = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
        # MERGE_UNROLL pieces' loads in flight per round trip to L2 (a long context alone in
        # the batch comes in as many pieces as programs); an absent piece weighs 0.
        for p0 in range(p_first, p_last + 1, MERGE_UNROLL):
            for u in tl.static_range(MERGE_UNROLL):
                p = p0 + u
                ok = (offs_m * 0 + p) <= p_last
                # Program p starts inside the request (slot 0) unless the request starts
                # later in p's range (then p ends inside it: slot 1).
                slot = tl.where(p * per >= start, 0, 1)
                row = (((p * 2 + slot) * num_kv_heads + kv_head) * BLOCK_M
                       + offs_m).to(tl.int64)
                # .cg: other programs wrote these (an L1 line could be stale).
                m_p = tl.load(part_ml_ptr + row * 2, mask=ok, other=-1.0e30,
                              cache_modifier=".cg")
                l_p = tl.load(part_ml_ptr + row * 2 + 1, mask=ok, other=0.0,
                              cache_modifier=".cg")
                a_p = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :],
                              mask=ok[:, None], other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m_all, m_p)
                alpha = tl.exp2(m_all - m_new)
                beta = tl.exp2(m_p - m_new)
                l_all = l_all * alpha + l_p * beta
                acc_all = acc_all * alpha[:, None] + a_p * beta[:, None]
                m_all = m_new
        tok = tl.load(qsl_ptr + b).to(tl.int64)
        o_ptrs = out_ptr + tok * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc_all / l_all[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.atomic_xchg(cnt, 0)


# Batch-dependent integers are not specialised: changing batches never recompile.
@triton.jit(do_not_specialize=["num_seqs", "num_progs"])
def _streamk_decode_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    qsl_ptr,
    cu_ptr,
    order_ptr,
    tile_tok_ptr,
    tile_info_ptr,
    tile_req_ptr,
    tile_blocks_ptr,
    part_acc_ptr,
    part_ml_ptr,
    cnt_ptr,
    qk_scale,
    num_seqs,
    num_progs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BPT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    total = tl.load(cu_ptr + num_seqs)
    per = tl.cdiv(total, num_progs)
    t0 = pid * per
    t1 = tl.minimum(t0 + per, total)
    if t0 >= t1:  # past the work (or no decode at all)
        return

    # Rows = the GQA group's query heads (padding rows clamped to a real head: finite values,
    # never stored to the output).
    offs_m = tl.arange(0, BLOCK_M)
    row_ok = offs_m < GROUP
    head = kv_head * GROUP + tl.minimum(offs_m, GROUP - 1)
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_ok = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    compute_dt = q_ptr.dtype.element_ty
    o_mask = row_ok[:, None] & d_ok[None, :]
    # Scratch rows of this program's two slots: [P, 2, KV heads, BLOCK_M].
    row0 = ((pid * 2 * num_kv_heads + kv_head) * BLOCK_M + offs_m).to(tl.int64)
    row1 = row0 + num_kv_heads * BLOCK_M

    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # The first tile of the current request: before t0 until one starts in this program.
    rs = t0 - 1
    for t in range(t0, t1):
        # Every address below is t's, or one gather from a per-tile array at t (the work
        # list): nothing carried from the previous tile, so the next tile's loads can be
        # issued before this one's math.
        tok = tl.load(tile_tok_ptr + t).to(tl.int64)
        info = tl.load(tile_info_ptr + t)
        first = ((info >> _FIRST_BIT) & 1) != 0
        last = ((info >> _LAST_BIT) & 1) != 0
        # q of the tile's request (a cache hit but at request changes).
        q = tl.load(q_ptr + tok * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=o_mask, other=0.0)
        if UPCAST_DOT:
            q = q.to(tl.float32)
        # Keys of tile t: a decode sees its whole context, so only keys past it are masked.
        n_ok = offs_n < (info & _KEYS_MASK)
        blk_row = tile_blocks_ptr + t * BPT  # capacity x BPT: the block table's size
        if BLOCK_N % BLOCK_SIZE == 0:  # tiles start on block boundaries
            blk = tl.load(blk_row + offs_n // BLOCK_SIZE).to(tl.int64)
            off = (offs_n % BLOCK_SIZE).to(tl.int64)
        else:
            nn = (info >> _OFFSET_SHIFT) + offs_n
            blk = tl.load(blk_row + nn // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
            off = (nn % BLOCK_SIZE).to(tl.int64)
        # A request's first tile: a fresh softmax state (acc need not be cleared: this tile
        # scales it by exp2(-1e30 - max) = 0).
        m_i = tl.where(first, -1.0e30, m_i)
        l_i = tl.where(first, 0.0, l_i)
        rs = tl.where(first, t, rs)
        k_ptrs = k_base + (blk * stride_kb + off * stride_kt)[None, :] + offs_d[:, None]
        k = tl.load(k_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0).to(compute_dt)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i)
        v_ptrs = v_base + (blk * stride_vb + off * stride_vt)[:, None] + offs_d[None, :]
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(compute_dt)
        acc = acc * alpha[:, None] + pv_dot(p, v, DOT_PRECISION, UPCAST_DOT)
        m_i = m_new

        # The request's last tile, or the program's: store its state (a branch, so a tile
        # in the middle of a request -- the common case -- does none of it). Whole in this
        # program: the output; else a partial in slot 0 (the request tile t0 lies in) or 1
        # (begun here, cut at t1).
        if last | (t == t1 - 1):
            if last & (rs >= t0):
                o_ptrs = out_ptr + tok * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
                tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
                         mask=o_mask)
            else:
                row = tl.where(rs <= t0, row0, row1)
                tl.store(part_acc_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :], acc)
                tl.store(part_ml_ptr + row * 2, m_i)
                tl.store(part_ml_ptr + row * 2 + 1, l_i)

    # Merge the (at most two) cut requests: the one tile t0 lies in (position j0 of the
    # walk), unless this program holds all of it; the one tile t1 - 1 lies in, if another
    # and it goes on past t1.
    j0 = tl.load(tile_req_ptr + t0)
    start0 = tl.load(cu_ptr + j0)
    end0 = tl.load(cu_ptr + j0 + 1)
    if (start0 < t0) | (end0 > t1):
        _merge_pieces(out_ptr, part_acc_ptr, part_ml_ptr, cnt_ptr, order_ptr, qsl_ptr, j0,
                      start0, end0, per, kv_head, num_kv_heads, stride_ot, stride_oh, offs_m,
                      row_ok, head, offs_d, d_ok, BLOCK_M, HEAD_DIM_P)
    j1 = tl.load(tile_req_ptr + t1 - 1)
    start1 = tl.load(cu_ptr + j1)
    end1 = tl.load(cu_ptr + j1 + 1)
    if (j1 != j0) & (end1 > t1):
        _merge_pieces(out_ptr, part_acc_ptr, part_ml_ptr, cnt_ptr, order_ptr, qsl_ptr, j1,
                      start1, end1, per, kv_head, num_kv_heads, stride_ot, stride_oh, offs_m,
                      row_ok, head, offs_d, d_ok, BLOCK_M, HEAD_DIM_P)


# --------------------------------------------------------------------------------------------
# Python entry point
# --------------------------------------------------------------------------------------------


def streamk_decode(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    tiles: DecodeTiles | None = None,
    order: torch.Tensor | None = None,
    programs: int | None = None,
    config: _Config | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Decode attention of the batch's single-token requests (others untouched) into ``out``
    (same layout as :func:`octavo.kernels.paged_attention.paged_attention`), in one stream-K
    launch. ``tiles``: the step's work list (default: computed here from ``order``, a
    permutation of the requests, or the batch order); ``programs``: P (default:
    :func:`num_programs`); ``config``: the tile (default: :func:`batch_config`; its BLOCK_N
    must be ``tiles.block_n``);
    ``max_seq_len``: a bound on ``seq_lens`` sizing a work list built here
    (:func:`tile_capacity`)."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert key_cache.dtype in (q.dtype, *_FP8_KV) and value_cache.dtype == key_cache.dtype
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    assert out.shape == q.shape and out.stride(-1) == 1 and q.stride(-1) == 1
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    on_gpu = q.device.type == "cuda"
    cfg = config or batch_config(num_seqs, num_heads, num_kv_heads, head_dim, q.dtype, q.device)
    if tiles is None:
        tiles = decode_tiles(query_start_loc, seq_lens, block_tables, block_size, cfg.block_n,
                             order, max_seq_len=max_seq_len)
    assert tiles.block_n == cfg.block_n, (tiles.block_n, cfg.block_n)
    assert tiles.block_size == block_size, (tiles.block_size, block_size)
    bpt = blocks_per_tile(cfg.block_n, block_size)
    assert tiles.tile_blocks.shape[1] == bpt and tiles.tile_blocks.dtype == torch.int32
    assert tiles.cu_tiles.shape == (num_seqs + 1,) and tiles.cu_tiles.dtype == torch.int32
    assert tiles.order.shape == (num_seqs,) and tiles.order.dtype == torch.int32
    if num_tokens == 0 or num_seqs == 0:
        return out
    head_dim_p = max(16, next_power_of_2(head_dim))
    progs = programs or num_programs(q.device, num_kv_heads)
    f32 = dict(dtype=torch.float32, device=q.device)
    part_acc = torch.empty((progs, 2, num_kv_heads, cfg.block_m, head_dim_p), **f32)
    part_ml = torch.empty((progs, 2, num_kv_heads, cfg.block_m, 2), **f32)
    cnt = split_k_counters(q.device, num_seqs * num_kv_heads)
    _streamk_decode_kernel[(progs, num_kv_heads)](
        out, q, key_cache, value_cache, query_start_loc, tiles.cu_tiles, tiles.order,
        tiles.tile_tok, tiles.tile_info, tiles.tile_req, tiles.tile_blocks, part_acc, part_ml,
        cnt,
        float(scale) * _LOG2E, num_seqs, progs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        GROUP=group, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_SIZE=block_size, BPT=bpt,
        HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # Triton's CPU interpreter mis-computes bf16 tl.dot; those dots run in fp32 there.
        UPCAST_DOT=not on_gpu and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(q.device),
    )  # fmt: skip
    return out
