"""The CUDA C++ stream-K decode attention (octavo/kernels/streamk_cuda.py,
cuda/streamk_attention.cu).

On any machine: what the wrapper supports, the ``OCTAVO_CUDA_KERNELS`` / ``OCTAVO_ATTN_CUDA``
switches (``available``, ``applies``, the backend's tile size), the shared memory of every
built plan against sm_90's limits (the wrapper's formula checked against the source's), the
kernel names the wrapper launches against the source's instantiations, the wrapper's
argument validation and its launch (a stub module on CPU tensors: grid, block, shared memory
and every parameter against the kernel's signature parsed from the source). Where nvcc is
found: one sm_90 build of every kernel, no spills.

On the GPU (``gpu`` marker): every built plan and program count at W1's shape; GQA groups,
dtypes, block sizes and contexts at tile edges with the KV past each context poisoned (NaN);
mixed batches; the engine's routing under ``OCTAVO_ATTN_CUDA=1``; CUDA graph replays over new
lengths; the longest-first walk.
"""

from __future__ import annotations

import ctypes
import random
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels import cuda_module, streamk_cuda  # noqa: E402
from octavo.kernels.paged_attention import paged_attention  # noqa: E402
from octavo.kernels.paged_attention_ref import paged_attention_ref  # noqa: E402
from octavo.kernels.paged_attention_streamk import (  # noqa: E402
    decode_tiles,
    decode_tiles_ref,
    streamk_decode,
)
from octavo.kernels.split_k import counters  # noqa: E402
from tests.kernels import cuda_checks  # noqa: E402
from tests.kernels.test_paged_attention import TOL, make_batch  # noqa: E402
from tests.kernels.test_paged_attention_streamk import _w1_batch  # noqa: E402

SRC = Path(streamk_cuda.__file__).parent / "cuda" / streamk_cuda.SOURCE
TN = {torch.bfloat16: "bf16", torch.float16: "f16"}
NAMES = [f"streamk_attention_{tn}_d128_g{g}_w{w}_p{s}" for tn in ("bf16", "f16")
         for g in streamk_cuda.GROUPS for w, s in sorted(streamk_cuda.BUILT)]
PLANS = sorted(streamk_cuda.BUILT)
SM90_OPTIN = 227 * 1024  # the most dynamic shared memory one CTA may opt in to
SM90_SM = 228 * 1024  # an SM's shared memory
CTA_RESERVED = 1024  # the driver's per-CTA reserve on sm_8x / sm_90


class _CudaQ:  # a GPU q's facts ([tokens, heads, head_dim]), no GPU needed
    shape, dtype, device = (5, 16, 128), torch.bfloat16, torch.device("cuda")


class _Cache:  # [blocks, block_size, KV heads, head_dim]
    shape, dtype = (100, 16, 8, 128), torch.bfloat16


# --------------------------------------------------------------------------------------------
# Any machine
# --------------------------------------------------------------------------------------------


def test_supports():
    bf16, f16 = torch.bfloat16, torch.float16
    for dtype in (bf16, f16):
        for group in (1, 2, 4, 8):
            for bs in (16, 32, 64):
                assert streamk_cuda.supports(dtype, dtype, group, 128, bs), (dtype, group, bs)
    assert not streamk_cuda.supports(torch.float32, torch.float32, 2, 128, 16)
    assert not streamk_cuda.supports(bf16, torch.float8_e4m3fn, 2, 128, 16)  # fp8 KV
    assert not streamk_cuda.supports(bf16, f16, 2, 128, 16)  # KV of another dtype
    assert not streamk_cuda.supports(f16, bf16, 2, 128, 16)
    for group in (3, 16):
        assert not streamk_cuda.supports(bf16, bf16, group, 128, 16), group
    assert not streamk_cuda.supports(bf16, bf16, 2, 64, 16)  # head_dim 128 only
    # 4 warps: 64-key tiles, each warp 16 keys of one block; 8 warps: 128-key tiles.
    for bs in (8, 128):
        assert not streamk_cuda.supports(bf16, bf16, 2, 128, bs, warps=4), bs
    assert streamk_cuda.supports(bf16, bf16, 2, 128, 64, warps=8)
    assert not streamk_cuda.supports(bf16, bf16, 2, 128, 128, warps=8)  # not a built size
    assert streamk_cuda.BLOCK_N == 16 * streamk_cuda.WARPS == 64
    assert (streamk_cuda.WARPS, streamk_cuda.STAGES) in streamk_cuda.BUILT


def test_available_where_built_unless_turned_off(monkeypatch):
    cuda_checks.check_switch(monkeypatch, streamk_cuda, "OCTAVO_CUDA_KERNELS", default=True)


def test_applies_only_when_switched_on_on_the_gpu(monkeypatch):
    """OCTAVO_ATTN_CUDA (default off) decides, given a built kernel and supported shapes;
    a CPU q never applies; nor does a shape or dtype the kernel lacks."""
    monkeypatch.setattr(streamk_cuda, "available", lambda device: True)
    monkeypatch.delenv("OCTAVO_ATTN_CUDA", raising=False)
    assert not streamk_cuda.applies(_CudaQ(), _Cache())
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "0")
    assert not streamk_cuda.applies(_CudaQ(), _Cache())
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "1")
    assert streamk_cuda.applies(_CudaQ(), _Cache())  # the switch alone made the difference

    class Fp8Cache(_Cache):
        dtype = torch.float8_e4m3fn

    class Blocks8(_Cache):
        shape = (100, 8, 8, 128)

    class Group3Q(_CudaQ):
        shape = (5, 24, 128)

    assert not streamk_cuda.applies(_CudaQ(), Fp8Cache())
    assert not streamk_cuda.applies(_CudaQ(), Blocks8())
    assert not streamk_cuda.applies(Group3Q(), _Cache())
    q = torch.zeros(5, 16, 128, dtype=torch.bfloat16)  # on the CPU
    kc = torch.zeros(10, 16, 8, 128, dtype=torch.bfloat16)
    assert not streamk_cuda.applies(q, kc)
    monkeypatch.setattr(streamk_cuda, "available", lambda device: False)  # no nvcc / GPU
    assert not streamk_cuda.applies(_CudaQ(), _Cache())


def test_the_backend_tiles_for_the_cuda_kernel_when_it_applies(monkeypatch):
    """The backend's step work list takes the CUDA kernel's 64-key tiles under
    OCTAVO_ATTN_CUDA=1 (where it applies), else the Triton kernel's 128."""
    from octavo.attention import triton_backend as tb
    from tests.kernels.test_triton_backend import _decode_meta

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tb, "decode_tiles", lambda qsl, sl, bt, bs, n, order, *, max_seq_len:
                        decode_tiles_ref(qsl, sl, bt, bs, n, order))
    monkeypatch.setattr(streamk_cuda, "available", lambda device: True)
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "1")
    monkeypatch.delenv("OCTAVO_ATTN_DECODE_TILE", raising=False)
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK_TILE", raising=False)
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "1")
    assert tb._decode_tiles(_decode_meta(5), _CudaQ(), _Cache(), None).block_n == 64
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "0")
    assert tb._decode_tiles(_decode_meta(5), _CudaQ(), _Cache(), None).block_n == 128


def test_shared_memory_of_every_plan_fits_sm90():
    """The wrapper's figure is the source's ``shared_bytes`` (its expression evaluated per
    plan); every plan fits one CTA's opt-in limit, and two CTAs of a 4-warp plan (the
    default's occupancy aim) fit an SM with the driver's per-CTA reserve."""
    src = SRC.read_text()
    m = re.search(r"constexpr int shared_bytes\(\) \{\s*return ([^;]+);", src)
    assert m, "shared_bytes() not found in the source"
    expr = m.group(1)
    assert expr == "WARPS * STAGES * 2 * 16 * D * 2 + WARPS * GROUP * (D + 2) * 4"
    assert re.fullmatch(r"[\w\s*+()]+", expr)  # integer products and sums only
    for warps, stages in PLANS:
        for group in streamk_cuda.GROUPS:
            env = {"D": 128, "GROUP": group, "WARPS": warps, "STAGES": stages}
            want = eval(expr, {"__builtins__": {}}, env)  # the text checked above
            got = streamk_cuda.shared_bytes(128, group, warps, stages)
            assert got == want, (warps, stages, group)
            assert got <= SM90_OPTIN, (warps, stages, group, got)
            if warps == 4:
                static = 16  # ticket_s, rounded
                assert 2 * (got + static + CTA_RESERVED) <= SM90_SM, (stages, group, got)
    # The default plan, named: 4 warps x 3 stages.
    assert streamk_cuda.shared_bytes(128, 8, 4, 3) == 98304 + 16640
    assert streamk_cuda.CTAS_PER_SM == {4: 2, 8: 1}
    for warps, stages in PLANS:  # the CTAs per SM the grid aims at fit an SM at once
        ctas = streamk_cuda.CTAS_PER_SM[warps]
        got = streamk_cuda.shared_bytes(128, 8, warps, stages)
        assert ctas * (got + 16 + CTA_RESERVED) <= SM90_SM, (warps, stages)


def test_the_launched_names_are_the_source_s_instantiations():
    """Every (dtype, group, plan) the wrapper can launch is instantiated by the source's
    macros, and no other: the macro expansion followed by hand."""
    src = SRC.read_text()
    plans = re.search(r"#define OCTAVO_STREAMK_ATTENTION_PLANS\(TN, T, GROUP\)(.*?)\n\n",
                      src, re.S).group(1)
    built = {(int(w), int(s)) for w, s in re.findall(
        r"OCTAVO_STREAMK_ATTENTION\(TN, T, 128, GROUP, (\d+), (\d+)\)", plans)}
    assert built == set(streamk_cuda.BUILT)
    alls = re.search(r"#define OCTAVO_STREAMK_ATTENTION_ALL\(TN, T\)(.*?)\n\n", src, re.S)
    groups = {int(g) for g in re.findall(r"OCTAVO_STREAMK_ATTENTION_PLANS\(TN, T, (\d+)\)",
                                         alls.group(1))}
    assert groups == set(streamk_cuda.GROUPS)
    types = dict(re.findall(r"^OCTAVO_STREAMK_ATTENTION_ALL\((\w+), (\w+)\)$", src, re.M))
    assert types == {"bf16": "__nv_bfloat16", "f16": "__half"}
    assert set(TN.values()) == set(types)
    expanded = {f"streamk_attention_{tn}_d128_g{g}_w{w}_p{s}"
                for tn in types for g in groups for w, s in built}
    assert expanded == set(NAMES)
    assert "streamk_attention_##TN##_d##D##_g##GROUP##_w##WARPS##_p##STAGES(" in src
    assert "constexpr int BLOCK_N = 16 * WARPS;" in src


@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="no nvcc on this machine")
def test_the_source_builds_for_hopper_without_spills(tmp_path, monkeypatch):
    spills = cuda_checks.build_once(streamk_cuda.SOURCE, NAMES, tmp_path, monkeypatch)
    assert not any(spills.values()), spills


def _cpu_case(dtype=torch.bfloat16, group=2, block_size=16, block_n=64, kv_dtype=None):
    kv_heads = 2
    q, kc, vc, qsl, sl, bt = make_batch([1, 1, 1], [45, 7, 130], group * kv_heads, kv_heads,
                                        128, block_size, dtype, "cpu")
    if kv_dtype is not None:
        kc, vc = kc.to(kv_dtype), vc.to(kv_dtype)
    tiles = decode_tiles_ref(qsl, sl, bt, block_size, block_n)
    return q, kc, vc, qsl, tiles


def test_the_wrapper_rejects_what_the_kernel_lacks_before_launching(monkeypatch):
    """Shapes and dtypes the kernels lack, plans not built, and work lists of another tile
    or block size raise ValueError before anything reaches CUDA (CPU tensors here)."""
    def no_launch(source, device):
        raise AssertionError("reached the launch")

    monkeypatch.setattr(cuda_module, "loaded", no_launch)
    q, kc, vc, qsl, tiles = _cpu_case()
    out = torch.empty_like(q)
    scale = 128**-0.5
    with pytest.raises(ValueError, match="tiles of 128 keys"):
        streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, _cpu_case(block_n=128)[4], scale, out,
                                         programs=3)
    with pytest.raises(ValueError, match="tiles of 64 keys"):  # 8 warps take 128
        streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, scale, out, programs=3,
                                         warps=8, stages=2)
    with pytest.raises(ValueError, match="blocks of 32"):  # a list for another cache
        streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, _cpu_case(block_size=32)[4], scale,
                                         out, programs=3)
    with pytest.raises(ValueError, match="not supported"):
        streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, scale, out, programs=3,
                                         warps=8, stages=3)  # not built
    for case in (dict(dtype=torch.float32), dict(kv_dtype=torch.float8_e4m3fn),
                 dict(group=3), dict(block_size=8)):
        qq, kk, vv, qs, tt = _cpu_case(**case)
        with pytest.raises(ValueError, match="not supported"):
            streamk_cuda.streamk_decode_cuda(qq, kk, vv, qs, tt, scale, torch.empty_like(qq),
                                             programs=3)
    with pytest.raises(ValueError, match="not supported"):  # V of another dtype than K
        streamk_cuda.streamk_decode_cuda(q, kc, vc.half(), qsl, tiles, scale, out, programs=3)


def _kernel_params(src: str) -> list[tuple[str, str]]:
    """(kind, name) of each parameter of the instantiated kernels: 'ptr', 'float', 'int'."""
    m = re.search(r"streamk_attention_##TN##[^(]*\((.*?)\)\s*\{", src, re.S)
    params = []
    for p in m.group(1).replace("\\", " ").split(","):
        words = p.split()
        kind = "ptr" if "*" in p else words[0]
        params.append((kind, words[-1].lstrip("*")))
    return params


@pytest.mark.parametrize("warps,stages", PLANS)
@pytest.mark.parametrize("dtype,group", [(torch.bfloat16, 2), (torch.float16, 8)])
def test_the_launch_passes_the_kernel_s_parameters(warps, stages, dtype, group, monkeypatch):
    """A stub module on CPU tensors records the launch: the kernel the plan names, grid
    (P, KV heads), 32 x warps threads, the plan's shared memory, and each parameter of the
    source's signature (pointer, float or int, in order) holding what it names."""
    launches = []

    class Stub:
        def launch(self, name, grid, block, args, pdl=False, shared_bytes=0):
            launches.append((name, grid, block, args, pdl, shared_bytes))

    monkeypatch.setattr(cuda_module, "loaded", lambda source, device: Stub())
    monkeypatch.setattr(streamk_cuda, "num_compute_units", lambda device: 132)
    q, kc, vc, qsl, tiles = _cpu_case(dtype=dtype, group=group, block_n=16 * warps)
    out = torch.empty_like(q)
    scale = 0.125
    for programs, want_progs in ((7, 7), (None, streamk_cuda.CTAS_PER_SM[warps] * 132 // 2)):
        launches.clear()
        got = streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, scale, out,
                                               programs=programs, warps=warps, stages=stages)
        assert got is out
        (name, grid, block, args, pdl, smem), = launches
        assert name == f"streamk_attention_{TN[dtype]}_d128_g{group}_w{warps}_p{stages}"
        assert name in NAMES
        assert grid == (want_progs, 2, 1) and block == 32 * warps and not pdl
        assert smem == streamk_cuda.shared_bytes(128, group, warps, stages)
    params = _kernel_params(SRC.read_text())
    assert len(args) == len(params) == 28
    want = {
        "out": out, "q": q, "kc": kc, "vc": vc, "cu": tiles.cu_tiles, "order": tiles.order,
        "tile_tok": tiles.tile_tok, "tile_info": tiles.tile_info, "tile_req": tiles.tile_req,
        "tile_blocks": tiles.tile_blocks, "cnt": counters(q.device, 1), "qsl": qsl,
        "num_seqs": 3, "num_progs": want_progs,
        "stride_qt": q.stride(0), "stride_qh": q.stride(1), "stride_ot": out.stride(0),
        "stride_oh": out.stride(1), "stride_kb": kc.stride(0), "stride_kt": kc.stride(1),
        "stride_kh": kc.stride(2), "stride_vb": vc.stride(0), "stride_vt": vc.stride(1),
        "stride_vh": vc.stride(2), "block_size": 16,
    }
    types = {"ptr": ctypes.c_void_p, "float": ctypes.c_float, "int": ctypes.c_int}
    for (kind, pname), arg in zip(params, args):
        assert isinstance(arg, types[kind]), (pname, arg)
        if pname in want:
            value = want[pname]
            value = value.data_ptr() if isinstance(value, torch.Tensor) else value
            assert arg.value == value, pname
        elif pname == "qk_scale":  # the exp2 domain's
            assert arg.value == pytest.approx(scale * 1.4426950408889634, rel=1e-6)
        else:  # the scratch partials
            assert pname in ("part_acc", "part_ml") and arg.value, pname
    assert {n for _, n in params} == set(want) | {"qk_scale", "part_acc", "part_ml"}


def test_num_programs(monkeypatch):
    monkeypatch.setattr(streamk_cuda, "num_compute_units", lambda device: 132)
    assert streamk_cuda.num_programs(torch.device("cuda"), 8) == 33
    assert streamk_cuda.num_programs(torch.device("cuda"), 8, ctas_per_sm=1) == 16
    assert streamk_cuda.num_programs(torch.device("cuda"), 8, warps=8) == 16  # one 8-warp CTA
    assert streamk_cuda.num_programs(torch.device("cuda"), 1000) == 1


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or cuda_module.nvcc_path() is None,
                                reason="needs a CUDA device and nvcc")


def _poison_past_contexts(kc, vc, seq_lens, block_tables):
    """NaN in every cache slot no context reaches (the tails of last blocks, blocks of no
    request): a kernel reading a masked key's K or V (0 x NaN) would show it."""
    bs = kc.shape[1]
    used = torch.zeros(kc.shape[0], dtype=torch.bool)
    bt = block_tables.cpu()
    for b, n in enumerate(seq_lens.tolist()):
        blocks = bt[b, :-(-n // bs)].long()
        used[blocks] = True
        if n % bs:
            kc[int(blocks[-1]), n % bs:] = float("nan")
            vc[int(blocks[-1]), n % bs:] = float("nan")
    kc[~used.to(kc.device)] = float("nan")
    vc[~used.to(vc.device)] = float("nan")


def _check(q_lens, seq_lens, heads=(16, 8, 128), block_size=16, dtype=torch.bfloat16,
           plan=(streamk_cuda.WARPS, streamk_cuda.STAGES), programs=None, order=None,
           poison=True, seed=0, device="cuda"):
    """The CUDA kernel over the batch into a NaN-filled output: the decode rows against the
    reference, the others untouched, every ticket counter left zeroed."""
    h, hkv, d = heads
    q, kc, vc, qsl, sl, bt = make_batch(q_lens, seq_lens, h, hkv, d, block_size, dtype, device,
                                        seed=seed)
    if poison:
        _poison_past_contexts(kc, vc, sl, bt)
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, d**-0.5)
    warps, stages = plan
    if order is not None:
        order = torch.tensor(order, dtype=torch.int32, device=device)
    tiles = decode_tiles(qsl, sl, bt, block_size, 16 * warps, order)
    out = torch.full_like(q, float("nan"))
    streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, d**-0.5, out, programs=programs,
                                     warps=warps, stages=stages)
    decode = torch.zeros(q.shape[0], dtype=torch.bool)
    for b, n in enumerate(q_lens):
        if n == 1:
            decode[sum(q_lens[:b])] = True
    decode = decode.to(device)
    assert not torch.isnan(out[decode]).any()
    torch.testing.assert_close(out[decode].float(), ref[decode].float(), **TOL[dtype])
    assert torch.isnan(out[~decode]).all()
    assert int(counters(q.device, 1).abs().sum()) == 0
    return out


@pytest.fixture(scope="module")
def w1():
    """W1's decode batch (256 requests, contexts 100-2,000, 16 heads over 8, head_dim 128,
    bf16, blocks of 16) and its reference output, built once."""
    lens, (q, kc, vc, qsl, sl, bt) = _w1_batch()
    return (q, kc, vc, qsl, sl, bt), paged_attention_ref(q, kc, vc, qsl, sl, bt, 128**-0.5)


@gpu
@needs_cuda
@pytest.mark.parametrize("programs", [None, 1, 7, 64])
@pytest.mark.parametrize("warps,stages", PLANS)
def test_w1_shape_every_plan(warps, stages, programs, w1):
    """Each built plan, the default grid, one CTA per KV head (every request whole in it),
    few CTAs (long cut ranges) and many: equal to the reference, every row written, the
    counters left zeroed, the same bits on a second run (merges in a fixed order)."""
    (q, kc, vc, qsl, sl, bt), ref = w1
    tiles = decode_tiles(qsl, sl, bt, 16, 16 * warps)
    out = torch.full_like(q, float("nan"))
    streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, 128**-0.5, out, programs=programs,
                                     warps=warps, stages=stages)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
    assert int(counters(q.device, 1).abs().sum()) == 0
    again = torch.full_like(q, float("nan"))
    streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, 128**-0.5, again,
                                     programs=programs, warps=warps, stages=stages)
    assert torch.equal(again, out)


EDGES = [1, 15, 16, 17, 63, 64, 65, 129, 3000]


@gpu
@needs_cuda
@pytest.mark.parametrize("warps,stages", PLANS)
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_groups_dtypes_block_sizes_and_tile_edges(group, dtype, block_size, warps, stages):
    """Contexts of one key, at and around every warp's 16 keys and every tile's 64 / 128, and
    a long one cut over the CTAs (3 of them: cut requests and merges), the KV past each
    context NaN."""
    _check([1] * len(EDGES), EDGES, heads=(2 * group, 2, 128), block_size=block_size,
           dtype=dtype, plan=(warps, stages), programs=3)


@gpu
@needs_cuda
@pytest.mark.parametrize("programs", [1, 3, 5])
def test_mixed_batch_leaves_other_rows(programs):
    """Prefill chunks and empty requests get no tile: their rows stay NaN; the decodes
    between them are right."""
    _check([9, 1, 0, 17, 1, 1, 4, 1], [30, 13, 5, 17, 1, 200, 80, 3000], programs=programs)


@gpu
@needs_cuda
def test_one_request_over_every_cta():
    """A lone long context in as many pieces as CTAs, merged by the last of them."""
    _check([1], [5000], programs=64)
    _check([1, 1], [5000, 3], programs=37)


@gpu
@needs_cuda
def test_the_engine_routes_decodes_to_the_kernel_when_switched_on(monkeypatch):
    """Under OCTAVO_ATTN_CUDA=1, paged_attention given a work list of the kernel's tiles and
    streamk_decode without one run the CUDA kernel (a spy sees it) and match the reference;
    a work list of Triton's tiles, an explicit program count or the switch off keep Triton."""
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "1")
    monkeypatch.delenv("OCTAVO_CUDA_KERNELS", raising=False)
    for knob in ("OCTAVO_ATTN_STREAMK", "OCTAVO_ATTN_STREAMK_TILE", "OCTAVO_ATTN_DECODE_TILE"):
        monkeypatch.delenv(knob, raising=False)
    calls = []
    real = streamk_cuda.streamk_decode_cuda
    monkeypatch.setattr(streamk_cuda, "streamk_decode_cuda",
                        lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    q, kc, vc, qsl, sl, bt = make_batch([1] * 6, [45, 7, 64, 1, 300, 2000], 16, 8, 128, 16,
                                        torch.bfloat16, "cuda")
    scale = 128**-0.5
    ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
    assert streamk_cuda.applies(q, kc)

    def close(out):
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])

    tiles = decode_tiles(qsl, sl, bt, 16, streamk_cuda.BLOCK_N)
    close(paged_attention(q, kc, vc, qsl, sl, bt, scale, max_query_len=1, decode_tiles=tiles))
    assert len(calls) == 1 and calls[-1] is tiles
    out = torch.full_like(q, float("nan"))
    close(streamk_decode(q, kc, vc, qsl, sl, bt, scale, out))
    assert len(calls) == 2 and calls[-1].block_n == streamk_cuda.BLOCK_N
    monkeypatch.setenv("OCTAVO_ATTN_STREAMK", "1")  # decode-only calls take stream-K
    close(paged_attention(q, kc, vc, qsl, sl, bt, scale, max_query_len=1))
    assert len(calls) == 3
    monkeypatch.delenv("OCTAVO_ATTN_STREAMK")
    # Triton's tiles (128 keys), an explicit grid: the Triton kernel.
    close(paged_attention(q, kc, vc, qsl, sl, bt, scale, max_query_len=1,
                          decode_tiles=decode_tiles(qsl, sl, bt, 16, 128)))
    close(streamk_decode(q, kc, vc, qsl, sl, bt, scale, torch.empty_like(q), programs=7))
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "0")
    close(streamk_decode(q, kc, vc, qsl, sl, bt, scale, torch.empty_like(q)))
    assert len(calls) == 3


@gpu
@needs_cuda
def test_cuda_graph_replays_new_lengths(monkeypatch):
    """Captured with the work list built inside the graph (as the engine's decode steps),
    replayed over other contexts: the grid and scratch do not depend on them."""
    monkeypatch.setenv("OCTAVO_ATTN_CUDA", "1")
    monkeypatch.delenv("OCTAVO_CUDA_KERNELS", raising=False)
    calls = []
    real = streamk_cuda.streamk_decode_cuda
    monkeypatch.setattr(streamk_cuda, "streamk_decode_cuda",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    lens, (q, kc, vc, qsl, sl, bt) = _w1_batch(batch=64, ctx=(1, 2000))
    scale = 128**-0.5
    out = torch.empty_like(q)

    def step():
        tiles = decode_tiles(qsl, sl, bt, kc.shape[1], streamk_cuda.BLOCK_N)
        paged_attention(q, kc, vc, qsl, sl, bt, scale, out=out, max_query_len=1,
                        decode_tiles=tiles)

    step()  # build and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert len(calls) == 2
    for seed in (1, 2):
        rnd = random.Random(seed)
        sl.copy_(torch.tensor([rnd.randint(1, n) for n in lens], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale)
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
        assert int(counters(q.device, 1).abs().sum()) == 0


@gpu
@needs_cuda
@pytest.mark.parametrize("programs", [None, 7])
def test_longest_first_order(programs, w1):
    """The walk in longest-first order (as the backend's full grids take it): each request's
    output stays its own, equal to the reference and to the batch-order walk."""
    (q, kc, vc, qsl, sl, bt), ref = w1
    outs = []
    for order in (None, torch.argsort(sl, descending=True, stable=True).to(torch.int32)):
        tiles = decode_tiles(qsl, sl, bt, 16, streamk_cuda.BLOCK_N, order)
        if order is not None:
            assert tiles.order.tolist() == order.tolist()
        out = torch.full_like(q, float("nan"))
        streamk_cuda.streamk_decode_cuda(q, kc, vc, qsl, tiles, 128**-0.5, out,
                                         programs=programs)
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
        outs.append(out)
    torch.testing.assert_close(outs[1].float(), outs[0].float(), **TOL[torch.bfloat16])
    assert int(counters(q.device, 1).abs().sum()) == 0
