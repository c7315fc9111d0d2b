"""Stream-K decode attention (octavo/kernels/paged_attention_streamk.py) against
paged_attention_ref and the per-request decode launch, through the interpreter on the CPU
(tiles of 16 keys, a few programs) and at W1's shape on the GPU."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.paged_attention import paged_attention  # noqa: E402
from octavo.kernels.paged_attention_config import _Config  # noqa: E402
from octavo.kernels.paged_attention_ref import paged_attention_ref  # noqa: E402
from octavo.kernels.paged_attention_streamk import (  # noqa: E402
    FIRST_BIT,
    KEYS_MASK,
    LAST_BIT,
    OFFSET_SHIFT,
    DecodeTiles,
    blocks_per_tile,
    decode_tiles,
    decode_tiles_ref,
    num_programs,
    streamk_config,
    streamk_decode,
    tile_capacity,
)
from octavo.kernels.split_k import counters  # noqa: E402
from tests.kernels.test_paged_attention import TOL, make_batch  # noqa: E402

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run(q_lens, seq_lens, heads=(8, 2, 32), block_size=4, dtype=torch.float32, device="cpu",
        programs=3, order=None, block_n=16, kv_dtype=None):
    """Stream-K over the batch into a NaN-filled output: decode rows against the reference,
    the other rows untouched; every ticket counter left at zero."""
    h, hkv, d = heads
    q, kc, vc, qsl, sl, bt = make_batch(q_lens, seq_lens, h, hkv, d, block_size, dtype,
                                        device)
    if kv_dtype is not None:
        kc, vc = kc.to(kv_dtype), vc.to(kv_dtype)
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, d**-0.5)
    out = torch.full_like(q, float("nan"))
    group = h // hkv
    cfg = _Config(1, max(16, group), block_n, 1, 1)
    if order is not None:
        order = torch.tensor(order, dtype=torch.int32, device=device)
    streamk_decode(q, kc, vc, qsl, sl, bt, d**-0.5, out, order=order, programs=programs,
                   config=cfg)
    decode = torch.zeros(q.shape[0], dtype=torch.bool)
    for b, n in enumerate(q_lens):
        if n == 1:
            decode[sum(q_lens[:b])] = True
    decode = decode.to(device)
    torch.testing.assert_close(out[decode].float(), ref[decode].float(), **TOL[dtype])
    assert torch.isnan(out[~decode]).all()
    assert int(counters(q.device, 1).abs().sum()) == 0
    return out


def _block_table(seq_lens, block_size, width=None, seed=0):
    """A block table of distinct random block ids (-1 past each context: never copied)."""
    gen = torch.Generator().manual_seed(seed)
    used = [-(-n // block_size) for n in seq_lens]
    width = width or max(used + [1])
    ids = torch.randperm(sum(used) + 1, generator=gen).to(torch.int32) + 1
    bt = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    k = 0
    for b, n in enumerate(used):
        bt[b, :n] = ids[k:k + n]
        k += n
    return bt


def _check_work_list(got: DecodeTiles, want: DecodeTiles):
    assert got.block_n == want.block_n and got.block_size == want.block_size
    for name in ("cu_tiles", "order", "tile_tok", "tile_info", "tile_req", "tile_blocks"):
        assert getattr(got, name).dtype == torch.int32, name
    assert got.cu_tiles.tolist() == want.cu_tiles.tolist()
    assert got.order.tolist() == want.order.tolist()
    total = int(want.cu_tiles[-1])
    assert got.tile_tok.shape[0] >= total and got.tile_blocks.shape[0] >= total
    assert got.tile_blocks.shape[1] == want.tile_blocks.shape[1]
    for name in ("tile_tok", "tile_info", "tile_req", "tile_blocks"):
        assert getattr(got, name)[:total].tolist() == getattr(want, name).tolist(), name


def test_decode_tiles_work_list(device):
    """Tiles per decode in the given order, requests without tiles (prefill chunks, empty
    rows) moved behind, stably; exclusive prefix sum; per tile its row, keys, flags, request
    and cache blocks (block size 4, tiles of 16 keys: four blocks a tile)."""
    qsl = torch.tensor([0, 1, 4, 5, 5, 6], dtype=torch.int32, device=device)
    sl = torch.tensor([33, 10, 16, 7, 1], dtype=torch.int32, device=device)
    bt = _block_table([33, 10, 16, 7, 1], 4).to(device)
    tiles = decode_tiles(qsl, sl, bt, 4, 16)
    assert tiles.block_n == 16 and tiles.block_size == 4
    assert tiles.order.dtype == torch.int32 and tiles.cu_tiles.dtype == torch.int32
    assert tiles.order.tolist() == [0, 2, 4, 1, 3]
    assert tiles.cu_tiles.tolist() == [0, 3, 4, 5, 5, 5]
    assert tiles.tile_tok[:5].tolist() == [0, 0, 0, 4, 5]
    assert tiles.tile_req[:5].tolist() == [0, 0, 0, 1, 2]
    first, last = 1 << FIRST_BIT, 1 << LAST_BIT
    assert tiles.tile_info[:5].tolist() == [16 | first, 16, 1 | last, 16 | first | last,
                                            1 | first | last]
    assert tiles.tile_blocks.shape[1] == 4
    bt_c = bt.cpu()
    assert tiles.tile_blocks[0].tolist() == bt_c[0, 0:4].tolist()
    assert tiles.tile_blocks[2].tolist() == [int(bt_c[0, 8]), 0, 0, 0]  # key 32 alone
    assert tiles.tile_blocks[3].tolist() == bt_c[2, 0:4].tolist()
    assert tiles.tile_blocks[4].tolist() == [int(bt_c[4, 0]), 0, 0, 0]
    _check_work_list(tiles, decode_tiles_ref(qsl, sl, bt, 4, 16))
    order = torch.tensor([4, 3, 2, 1, 0], dtype=torch.int32, device=device)
    tiles = decode_tiles(qsl, sl, bt, 4, 16, order)
    assert tiles.order.tolist() == [4, 2, 0, 3, 1]
    assert tiles.cu_tiles.tolist() == [0, 1, 2, 5, 5, 5]
    assert tiles.tile_req[:5].tolist() == [0, 1, 2, 2, 2]
    _check_work_list(tiles, decode_tiles_ref(qsl, sl, bt, 4, 16, order))


@pytest.mark.parametrize("block_size,block_n", [(16, 16), (16, 32), (4, 16), (32, 16),
                                                (3, 16), (5, 4)])
def test_decode_tiles_blocks_and_partial_tiles(block_size, block_n, device):
    """Each tile's cache blocks: tiles of whole blocks (16/16, 16/32, 4/16), tiles inside a
    block (32/16: one block, the tile's offset in it in tile_info) and block sizes dividing
    no tile (3/16, 5/4); contexts ending exactly on a tile, one key into it, mid-tile."""
    lens = [block_n, block_n + 1, 3 * block_n - 1, 1, 2 * block_n, 5 * block_n + 3]
    n = len(lens)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
    sl = torch.tensor(lens, dtype=torch.int32, device=device)
    bt = _block_table(lens, block_size, seed=block_size).to(device)
    got = decode_tiles(qsl, sl, bt, block_size, block_n)
    want = decode_tiles_ref(qsl, sl, bt, block_size, block_n)
    _check_work_list(got, want)
    assert got.tile_blocks.shape[1] == blocks_per_tile(block_n, block_size)
    # The reference itself, key by key: tile t's key n lies in block
    # tile_blocks[t][(offset + n) // block_size] at (offset + n) % block_size.
    bt_c = bt.cpu()
    t = 0
    for b, length in enumerate(lens):
        for k in range(-(-length // block_n)):
            info = int(want.tile_info[t])
            keys, offset = info & KEYS_MASK, info >> OFFSET_SHIFT
            assert keys == min(block_n, length - k * block_n)
            assert bool(info >> FIRST_BIT & 1) == (k == 0)
            assert bool(info >> LAST_BIT & 1) == ((k + 1) * block_n >= length)
            assert int(want.tile_tok[t]) == b
            for i in range(keys):
                key = k * block_n + i
                blk = int(want.tile_blocks[t][(offset + i) // block_size])
                assert blk == int(bt_c[b, key // block_size])
                assert (offset + i) % block_size == key % block_size
            t += 1
    assert t == int(want.cu_tiles[-1])


def test_decode_tiles_capacity():
    """Sized on the host: every request at the block table's reach, or at max_seq_len."""
    bt = torch.zeros((5, 10), dtype=torch.int32)
    assert tile_capacity(5, bt, 16, 128) == 5 * 2
    assert tile_capacity(5, bt, 16, 16) == 5 * 10
    assert tile_capacity(5, bt, 16, 16, max_seq_len=40) == 5 * 3
    assert tile_capacity(5, bt, 16, 16, max_seq_len=4000) == 5 * 10
    qsl = torch.arange(6, dtype=torch.int32)
    sl = torch.tensor([160, 1, 17, 16, 100], dtype=torch.int32)
    bt = _block_table(sl.tolist(), 16, width=10)
    tiles = decode_tiles(qsl, sl, bt, 16, 16, max_seq_len=160)
    assert tiles.tile_tok.shape == (50,) and tiles.tile_blocks.shape == (50, 1)
    _check_work_list(tiles, decode_tiles_ref(qsl, sl, bt, 16, 16))


@pytest.mark.parametrize("num_seqs", [1, 5, 16, 37])
@pytest.mark.parametrize("ordered", [False, True])
def test_decode_tiles_kernel_matches_torch(num_seqs, ordered, device):
    """The work-list launch builds what the torch ops do."""
    gen = torch.Generator().manual_seed(num_seqs)
    # Mostly decodes, some empty rows and prefill chunks.
    q_lens = torch.tensor([1, 1, 1, 0, 5])[torch.randint(0, 5, (num_seqs,), generator=gen)]
    qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
    qsl[1:] = q_lens.cumsum(0)
    sl = (q_lens + torch.randint(0, 300, (num_seqs,), generator=gen)).to(torch.int32)
    bt = _block_table(sl.tolist(), 16, seed=num_seqs)
    order = torch.randperm(num_seqs, generator=gen).to(torch.int32) if ordered else None
    args = [t.to(device) if t is not None else None for t in (qsl, sl, bt, order)]
    got = decode_tiles(args[0], args[1], args[2], 16, 64, args[3])
    want = decode_tiles_ref(args[0], args[1], args[2], 16, 64, args[3])
    assert got.block_n == 64
    _check_work_list(got, want)


def test_work_list_rebuilt_for_a_new_block_table(device):
    """The tiles' blocks are copied from the block table when the list is built: a step
    whose table changed needs (and gets) a new list; attention through it is right."""
    lens = [45, 7, 64]
    q, kc, vc, qsl, sl, bt = make_batch([1] * 3, lens, 8, 2, 32, 4, torch.float32, device)
    cfg = _Config(1, 16, 16, 1, 1)
    scale = 32**-0.5
    out = torch.full_like(q, float("nan"))
    tiles = decode_tiles(qsl, sl, bt, 4, 16)
    streamk_decode(q, kc, vc, qsl, sl, bt, scale, out, tiles=tiles, programs=3, config=cfg)
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    # Move request 1's blocks elsewhere (copy its K/V along), rebuild the list.
    used = -(-lens[1] // 4)
    old = bt[1, :used].clone()
    taken = {int(x) for b, n in enumerate(lens) for x in bt[b, :-(-n // 4)]}
    free = [x for x in range(kc.shape[0]) if x not in taken]
    new = torch.tensor(free[:used], dtype=torch.int32, device=device)
    kc[new.long()] = kc[old.long()]
    vc[new.long()] = vc[old.long()]
    kc[old.long()] = float("nan")
    vc[old.long()] = float("nan")
    bt[1, :used] = new
    tiles = decode_tiles(qsl, sl, bt, 4, 16)
    out.fill_(float("nan"))
    streamk_decode(q, kc, vc, qsl, sl, bt, scale, out, tiles=tiles, programs=3, config=cfg)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


@pytest.mark.parametrize("programs", [1, 2, 3, 7, 64])
def test_programs(programs, device):
    """One program for all; ranges cutting requests at every place (a request in many
    pieces, several short ones in one program, one-key contexts); more programs than
    tiles."""
    run([1] * 6, [45, 7, 64, 1, 30, 100], programs=programs, device=device)


@pytest.mark.parametrize("block_size,block_n", [(16, 16), (16, 32), (32, 16), (3, 16),
                                                (16, 64)])
@pytest.mark.parametrize("programs", [1, 4])
def test_block_size_and_tile(block_size, block_n, programs, device):
    """Tiles of one block, of two (16/16, 16/32), of four (16/64: a small grid's tile on the
    GPU), a tile inside a block (32/16: read at its offset) and a block size dividing no tile
    (3/16); last tiles partial or full."""
    run([1] * 5, [2 * block_n, 70, block_n + 1, 1, 33], block_size=block_size,
        block_n=block_n, programs=programs, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4, 64), (8, 4, 32), (8, 2, 128), (16, 2, 64)])
def test_gqa_head_dim_dtype(dtype, heads, device):
    """GQA groups 1, 2, 4, 8; head_dim 32, 64, 128; fp32 / fp16 / bf16 q."""
    run([1] * 4, [50, 3, 17, 33], heads=heads, dtype=dtype, programs=4, device=device)


def test_head_dim_not_a_power_of_two(device):
    run([1] * 3, [20, 37, 5], heads=(6, 2, 48), programs=2, device=device)


def test_mixed_batch_leaves_prefills(device):
    """Prefill chunks and empty rows count no tile: their rows are not written."""
    run([9, 1, 0, 17, 1, 1], [30, 13, 5, 17, 1, 40], programs=3, device=device)


def test_order(device):
    """The walk takes the requests in the order given; outputs stay each request's own."""
    run([1] * 5, [45, 7, 64, 1, 30], order=[2, 0, 4, 1, 3], programs=3, device=device)


def test_float8_cache(device):
    run([1] * 3, [40, 9, 23], dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn,
        programs=3, device=device)


@pytest.mark.parametrize("programs", [8, 13])
def test_long_context_in_many_pieces(programs, device):
    """One request over every program (tile size 16: 39 of the 41 tiles, in 8 or 13 pieces,
    merged 4 at a time) beside short ones, block size 16."""
    run([1, 1, 1], [620, 2, 18], block_size=16, programs=programs, device=device)


@pytest.mark.parametrize("seed", range(4))
def test_random_batches(seed, device):
    """Random mixes of decodes (1-90 keys), prefill chunks and empty rows, random order and
    program count."""
    rnd = random.Random(seed)
    n = rnd.randint(1, 9)
    q_lens = [rnd.choice([1, 1, 1, 1, 0, 3]) for _ in range(n)]
    seq_lens = [max(q, rnd.randint(1, 90)) for q in q_lens]
    order = list(range(n))
    rnd.shuffle(order)
    run(q_lens, seq_lens, programs=rnd.randint(1, 12), order=order, device=device)


def test_num_programs(monkeypatch):
    from octavo.kernels import paged_attention_streamk as sk

    monkeypatch.setattr(sk, "num_compute_units", lambda device: 132)
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK_WAVES", raising=False)
    assert num_programs(torch.device("cuda"), 8) == sk.DEFAULT_WAVES * 132 // 8
    assert num_programs(torch.device("cuda"), 8, waves=1) == 16
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK_WAVES", "4")
    assert num_programs(torch.device("cuda"), 8) == 66
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK_WAVES", "x")
    with pytest.raises(ValueError, match="an integer 1-64"):
        num_programs(torch.device("cuda"), 8)


@pytest.mark.parametrize("knob", ["1", "0"])
def test_paged_attention_dispatch(knob, monkeypatch, device):
    """OCTAVO_ATTN_STREAMK=1 sends decode-only calls without a split count to stream-K (a
    stub here sees the call); given ``decode_tiles``, any call's decode launch is stream-K."""
    from octavo.kernels import paged_attention as pa

    calls = []
    real = pa.streamk_decode
    monkeypatch.setattr(pa, "streamk_decode",
                        lambda *a, **k: calls.append(k) or real(*a, **k))
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", knob)
    q, kc, vc, qsl, sl, bt = make_batch([1, 1, 1], [45, 7, 64], 8, 2, 32, 4, torch.float32,
                                        device)
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, 32**-0.5)
    out = paged_attention(q, kc, vc, qsl, sl, bt, 32**-0.5, max_query_len=1)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    assert len(calls) == (knob == "1")
    paged_attention(q, kc, vc, qsl, sl, bt, 32**-0.5, max_query_len=1, num_splits=2)
    assert len(calls) == (knob == "1")  # a forced split count keeps the split launch
    tiles = decode_tiles(qsl, sl, bt, 4, 16)
    out = paged_attention(q, kc, vc, qsl, sl, bt, 32**-0.5, decode_tiles=tiles)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    assert len(calls) == 1 + (knob == "1") and calls[-1]["tiles"] is tiles


def test_backend_work_list_once_per_step(monkeypatch):
    """The backend builds the work list for decode-only GPU steps, by default those of two
    requests or more (OCTAVO_ATTN_STREAMK forces either way), once per step (shared by
    layers), keyed by capture; never otherwise."""
    from octavo.attention import triton_backend as tb
    from tests.kernels.test_triton_backend import _decode_meta

    class FakeQ:  # a GPU q's shape facts, no GPU needed
        shape, dtype, device = (5, 16, 128), torch.bfloat16, torch.device("cuda")

    class FakeCache:  # [blocks, block_size, KV heads, head_dim]
        shape = (100, 16, 8, 128)

    capturing = [False]
    seen = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def fake_decode_tiles(qsl, sl, bt, block_size, n, order, *, max_seq_len):
        seen.append((bt, block_size, max_seq_len))
        return DecodeTiles(qsl, sl, n, None, None, None, None, block_size)

    monkeypatch.setattr(tb, "decode_tiles", fake_decode_tiles)
    from octavo.kernels import paged_attention_streamk as streamk_mod

    # the grid's SM count, where batch_config reads it
    monkeypatch.setattr(streamk_mod, "num_compute_units", lambda device: 132)
    meta = _decode_meta(5)
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK", raising=False)
    one = _decode_meta(1)  # one request: the split parts and their merge launch
    assert tb._decode_tiles(one, FakeQ(), FakeCache(), None) is None
    assert tb._decode_tiles(_decode_meta(2), FakeQ(), FakeCache(), None) is not None
    assert tb._decode_tiles(_decode_meta(33), FakeQ(), FakeCache(), None) is not None
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "0")
    assert tb._decode_tiles(_decode_meta(33), FakeQ(), FakeCache(), None) is None
    seen.clear()
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "1")
    assert tb._decode_tiles(_decode_meta(1), FakeQ(), FakeCache(), None) is not None
    seen.clear()
    monkeypatch.delenv("OCTAVO_ATTN_DECODE_TILE", raising=False)
    tiles = tb._decode_tiles(meta, FakeQ(), FakeCache(), None)
    # 5 requests x 8 KV heads: at most one pair per SM of 132, the small grid's 64-key tiles
    assert tiles.block_n == 64 and tiles.block_size == 16
    assert seen == [(meta.block_tables, 16, meta.max_seq_len)]
    assert tb._decode_tiles(_decode_meta(16), FakeQ(), FakeCache(), None).block_n == 64
    assert tb._decode_tiles(_decode_meta(17), FakeQ(), FakeCache(), None).block_n == 128
    assert tb._decode_tiles(meta, FakeQ(), FakeCache(), None) is tiles
    capturing[0] = True
    assert tb._decode_tiles(meta, FakeQ(), FakeCache(), None) is not tiles
    # not decode-only
    assert tb._decode_tiles(_decode_meta(5, 4), FakeQ(), FakeCache(), None) is None


def test_streamk_tile_knob_wins_over_the_decode_tile_knob(monkeypatch):
    """On the GPU stream-K's tile is its default (128 keys, three stages), the decode knob's
    where only that is set, and its own knob's where set (the per-request launches of the
    same run keep the decode knob's)."""
    from octavo.kernels.paged_attention_config import _pick_config
    from octavo.kernels.paged_attention_streamk import streamk_config

    monkeypatch.delenv("OCTAVO_ATTN_STREAMK_TILE", raising=False)
    monkeypatch.delenv("OCTAVO_ATTN_DECODE_TILE", raising=False)
    cfg = streamk_config(2, 128, torch.bfloat16, on_gpu=True)
    assert (cfg.block_n, cfg.num_warps, cfg.num_stages) == (128, 4, 3)
    monkeypatch.setenv("OCTAVO_ATTN_DECODE_TILE", "32,2,2")
    cfg = streamk_config(2, 128, torch.bfloat16, on_gpu=True)
    assert (cfg.block_n, cfg.num_warps, cfg.num_stages) == (32, 2, 2)
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK_TILE", "64,4,2")
    cfg = streamk_config(2, 128, torch.bfloat16, on_gpu=True)
    assert (cfg.block_n, cfg.num_warps, cfg.num_stages) == (64, 4, 2)
    assert cfg.block_m == _pick_config(True, 2, 128, 2, True).block_m
    # the interpreter's tiles ignore both knobs
    assert streamk_config(2, 128, torch.bfloat16, on_gpu=False).block_n == 16


def test_small_grids_take_64_key_tiles(monkeypatch):
    """At most one (request, KV head) pair per SM: 64-key stream-K tiles in two stages
    (bf16, head_dim 128), the rest of the tile kept; a tile knob still wins; the interpreter
    keeps its own."""
    from octavo.kernels.paged_attention_streamk import (
        SMALL_GRID_BLOCK_N,
        SMALL_GRID_STAGES,
        small_grid,
    )

    monkeypatch.delenv("OCTAVO_ATTN_STREAMK_TILE", raising=False)
    monkeypatch.delenv("OCTAVO_ATTN_DECODE_TILE", raising=False)
    assert small_grid(16, 8, 132) and small_grid(1, 8, 8) and not small_grid(17, 8, 132)
    whole = streamk_config(4, 128, torch.bfloat16, on_gpu=True)
    small = streamk_config(4, 128, torch.bfloat16, on_gpu=True, small=True)
    assert (whole.block_n, small.block_n) == (128, SMALL_GRID_BLOCK_N) == (128, 64)
    assert (small.block_m, small.num_warps) == (whole.block_m, whole.num_warps)
    assert (whole.num_stages, small.num_stages) == (3, SMALL_GRID_STAGES) == (3, 2)
    # float32 rows already step fewer keys: kept
    assert streamk_config(4, 128, torch.float32, on_gpu=True, small=True).block_n == 64
    assert streamk_config(4, 256, torch.float32, on_gpu=True, small=True).block_n == 32
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK_TILE", "128,4,3")
    assert streamk_config(4, 128, torch.bfloat16, on_gpu=True, small=True).block_n == 128
    assert streamk_config(4, 128, torch.bfloat16, on_gpu=False, small=True).block_n == 16


def test_split_launches_take_the_shorter_tile():
    """A split decode launch (fewer programs than SMs) steps 64 keys where a whole one steps
    128 (bf16, head_dim 128); rows that already take 64 or fewer keep theirs."""
    from octavo.kernels.paged_attention_config import _pick_config

    assert _pick_config(True, 2, 128, 2, True).block_n == 128
    assert _pick_config(True, 2, 128, 2, True, split=True).block_n == 64
    assert _pick_config(True, 2, 256, 2, True, split=True).block_n == 64
    assert _pick_config(True, 2, 256, 4, True, split=True).block_n == 32


# --------------------------------------------------------------------------------------------
# GPU: W1's shape
# --------------------------------------------------------------------------------------------


def _w1_batch(batch=256, ctx=(100, 2000), heads=16, kv_heads=8, d=128, bs=16, seed=0):
    rnd = random.Random(seed)
    lens = [rnd.randint(*ctx) for _ in range(batch)]
    return lens, make_batch([1] * batch, lens, heads, kv_heads, d, bs, torch.bfloat16, "cuda",
                            seed=seed)


@gpu
@needs_cuda
@pytest.mark.parametrize("waves", [1, 2, 4])
@pytest.mark.parametrize("longest_first", [False, True])
def test_w1_shape(waves, longest_first, monkeypatch):
    """Batch 256, contexts 100-2,000, 16 heads over 8, head_dim 128, bf16, the real tile:
    equal to the reference and close to the per-request launch; counters left zeroed."""
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK", raising=False)  # the baseline: per request
    lens, (q, kc, vc, qsl, sl, bt) = _w1_batch()
    scale = 128**-0.5
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
    base = paged_attention(q, kc, vc, qsl, sl, bt, scale, max_query_len=1)
    order = (torch.argsort(sl, descending=True, stable=True).to(torch.int32)
             if longest_first else None)
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK_WAVES", str(waves))
    out = torch.full_like(q, float("nan"))
    streamk_decode(q, kc, vc, qsl, sl, bt, scale, out, order=order)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(out.float(), base.float(), **TOL[torch.bfloat16])
    assert int(counters(q.device, 1).abs().sum()) == 0


@gpu
@needs_cuda
@pytest.mark.parametrize("batch,heads", [(16, 32), (8, 16), (2, 32)])
def test_small_grid_shape(batch, heads, monkeypatch):
    """Batches of at most one (request, KV head) pair per SM (Llama-8B's and Qwen3-0.6B's
    heads over 8, contexts 100-400, bf16) on their default 64-key tiles: equal to the
    reference and close to the per-request launch; counters left zeroed."""
    from octavo.kernels.paged_attention_streamk import small_grid
    from octavo.kernels.triton_utils import num_compute_units

    monkeypatch.delenv("OCTAVO_ATTN_STREAMK", raising=False)
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK_TILE", raising=False)
    monkeypatch.delenv("OCTAVO_ATTN_DECODE_TILE", raising=False)
    assert small_grid(batch, 8, num_compute_units(torch.device("cuda")))
    lens, (q, kc, vc, qsl, sl, bt) = _w1_batch(batch=batch, ctx=(100, 400), heads=heads,
                                               seed=batch)
    scale = 128**-0.5
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
    base = paged_attention(q, kc, vc, qsl, sl, bt, scale, max_query_len=1, num_splits=1)
    out = torch.full_like(q, float("nan"))
    streamk_decode(q, kc, vc, qsl, sl, bt, scale, out)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(out.float(), base.float(), **TOL[torch.bfloat16])
    assert int(counters(q.device, 1).abs().sum()) == 0


@gpu
@needs_cuda
def test_cuda_graph_replays_new_lengths(monkeypatch):
    """Captured with the work list built inside the graph (as the engine's decode steps do),
    replayed over other contexts: the grid does not depend on them."""
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "1")
    lens, (q, kc, vc, qsl, sl, bt) = _w1_batch(batch=64, ctx=(1, 2000))
    scale = 128**-0.5
    out = torch.empty_like(q)

    block_n = streamk_config(2, 128, torch.bfloat16, True).block_n

    def step():
        tiles = decode_tiles(qsl, sl, bt, kc.shape[1], block_n)
        paged_attention(q, kc, vc, qsl, sl, bt, scale, out=out, max_query_len=1,
                        decode_tiles=tiles)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (1, 2):
        rnd = random.Random(seed)
        sl.copy_(torch.tensor([rnd.randint(1, n) for n in lens], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


@gpu
@needs_cuda
def test_engine_greedy_fp32_identical(tmp_path, monkeypatch):
    """The engine under OCTAVO_ATTN_STREAMK=1 (decode steps in CUDA graphs, the work list
    built once per step) generates the torch backend's tokens."""
    from tests.test_triton_e2e import _generate
    from tests.tiny_models import make_checkpoint

    folder = make_checkpoint("llama", str(tmp_path))
    ref = _generate(folder, "torch", "float32")
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "1")
    got = _generate(folder, "triton", "float32")
    assert [t for t, _ in got] == [t for t, _ in ref]
