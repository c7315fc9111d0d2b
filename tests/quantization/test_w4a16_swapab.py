"""The swap-AB weight-only integer GEMM (octavo/kernels/w4a16_swapab.py) against the
dequantize-then-matmul reference: small shapes through the interpreter on the CPU, real shapes
on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.w4a16_gemm import pack_along_k, w4a16_gemm, w4a16_gemm_ref  # noqa: E402
from octavo.kernels.w4a16_swapab import (  # noqa: E402
    pack_swapab,
    repack_swapab,
    supports,
    unpack_swapab,
)
from tests.quantization.gemm_checks import check_graph_replays, rel_err  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weights(k, n, group, bits, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g)
    scales = (torch.rand(k // group, n, generator=g) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g).half()
    return q, pack_along_k(q, bits).to(device), scales.to(device), zeros.to(device)


_rel_err = rel_err


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_round_trip_and_repack(bits):
    q = torch.randint(0, 2**bits, (32, 64 * 16 // bits))
    packed = pack_swapab(q, bits)
    assert packed.dtype == torch.int16 and packed.shape == (q.shape[1] * bits // 16, 32)
    assert torch.equal(unpack_swapab(packed, bits), q.to(torch.int32))
    assert torch.equal(repack_swapab(pack_along_k(q, bits), bits), packed)


def test_layout_puts_value_c_of_row_r_at_column_c_times_64_plus_r():
    q = torch.zeros(16, 256, dtype=torch.int64)
    q[3, 64 * 2 + 5] = 9  # n = 133: block c = 2, row r = 5
    packed = pack_swapab(q, 4).to(torch.int32) & 0xFFFF
    assert packed[5, 3].item() == 9 << 8 and packed.count_nonzero().item() == 1


def test_supports():
    assert supports(4096, 4096, 128, 4) and supports(4096, 128, 32, 8)
    assert not supports(4096, 128, 128, 4)  # 4-bit tiles are 256 columns
    assert not supports(4096, 4096, 8, 4)


SMALL = [  # m, k, n, group, bits
    (1, 64, 256, 32, 4), (3, 128, 256, 64, 4), (16, 256, 256, 128, 4), (33, 128, 512, 64, 4),
    (1, 64, 128, 32, 8), (3, 128, 128, 128, 8), (16, 128, 256, 64, 8), (33, 64, 128, 32, 8),
]


@pytest.mark.parametrize("m,k,n,group,bits", SMALL)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_reference(m, k, n, group, bits, dtype):
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        pytest.skip("bf16 tl.dot is wrong in Triton's CPU interpreter (see test_w4a16_gemm)")
    q, qweight, scales, zeros = _weights(k, n, group, bits)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    out = w4a16_gemm(x, pack_swapab(q, bits).to(DEVICE), scales.to(dtype), zeros.to(dtype),
                     group, bits, path="swapab")
    ref = w4a16_gemm_ref(x.float(), qweight, scales.to(dtype), zeros.to(dtype), group, bits)
    assert out.shape == (m, n) and out.dtype == dtype
    assert _rel_err(out, ref) < 5e-3


@pytest.mark.parametrize("split_k", [1, 3])
def test_float32_and_split_k(split_k):
    q, qweight, scales, zeros = _weights(256, 256, 64, 4)
    x = torch.randn(5, 256, device=DEVICE)
    out = w4a16_gemm(x, pack_swapab(q, 4).to(DEVICE), scales, zeros, 64, 4, path="swapab",
                     split_k=split_k)
    assert _rel_err(out, w4a16_gemm_ref(x, qweight, scales, zeros, 64, 4)) < 1e-5


@pytest.mark.parametrize("split_k", [1, 2])
def test_the_q_minus_128_operands_of_bf16_8_bit(split_k, monkeypatch):
    """bf16 8-bit weights take the operand q - 128 (MAGIC 3, the zero points biased by -128
    to match). The interpreter's bf16 dot is wrong, so the form runs here on float32
    activations, where its non-PTX operand (bits - 128) is exact as well; the PTX is
    test_inline_ptx_dequantizes_every_value's."""
    from octavo.kernels import w4a16_swapab

    assert w4a16_swapab._magic(torch.bfloat16, 8) == 3
    monkeypatch.setattr(w4a16_swapab, "_magic", lambda dtype, bits: 3)
    q, qweight, scales, zeros = _weights(256, 128, 64, 8)
    x = torch.randn(5, 256, device=DEVICE)
    out = w4a16_gemm(x, pack_swapab(q, 8).to(DEVICE), scales, zeros, 64, 8, path="swapab",
                     split_k=split_k)
    assert _rel_err(out, w4a16_gemm_ref(x, qweight, scales, zeros, 64, 8)) < 1e-5


@pytest.mark.parametrize("m,k,group,bits,tuning", [
    (3, 1024, 1024, 4, {}),  # one group over K: folds every 512 rows, a K step of 128
    (5, 256, 128, 4, {"block_k": 64, "split_k": 2}),  # a fold every other step
    (17, 256, 64, 8, {"block_k": 32, "block_m": 16}),  # two batch tiles
    (33, 128, 32, 4, {"block_m": 64}),
    # Tiles of 16 / 32 int16 rows inside the layout's 64-row blocks (mma.sync, 1-2 warps).
    (1, 256, 128, 4, {"block_r": 32, "split_k": 2}),
    (2, 128, 64, 8, {"block_r": 16}),
    (16, 128, 128, 4, {"block_r": 16, "block_k": 64}),
    (5, 128, 64, 4, {"block_r": 16, "block_m": 8}),  # batch tiles of 8 (mma.sync's n8)
    (9, 128, 64, 8, {"block_r": 16, "block_m": 8}),  # two of them
])
def test_folds_tiles_and_splits(m, k, group, bits, tuning):
    n = 64 * 16 // bits
    q, qweight, scales, zeros = _weights(k, n, group, bits)
    x = torch.randn(m, k, device=DEVICE).half()
    out = w4a16_gemm(x, pack_swapab(q, bits).to(DEVICE), scales, zeros, group, bits,
                     path="swapab", **tuning)
    assert _rel_err(out, w4a16_gemm_ref(x.float(), qweight, scales, zeros, group, bits)) < 5e-3


def test_leading_dims_and_empty_batch():
    q, qweight, scales, zeros = _weights(64, 256, 32, 4)
    packed = pack_swapab(q, 4).to(DEVICE)
    x = torch.randn(2, 3, 64, device=DEVICE).half()
    out = w4a16_gemm(x, packed, scales, zeros, 32, 4, path="swapab")
    assert out.shape == (2, 3, 256)
    assert _rel_err(out, w4a16_gemm_ref(x.float(), qweight, scales, zeros, 32, 4)) < 5e-3
    empty = w4a16_gemm(torch.empty(0, 64, device=DEVICE).half(), packed, scales, zeros, 32, 4,
                       path="swapab")
    assert empty.shape == (0, 256)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [{}, {"block_m": 64}, {"block_k": 64}, {"block_r": 32},
                                    {"block_r": 16, "block_m": 8}],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 16, 128])
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096)])
def test_real_shapes_gpu(m, dtype, bits, k, n, tuning):
    """On the GPU the inline-PTX dequantization runs (the interpreter runs the Triton ops)."""
    q, qweight, scales, zeros = _weights(k, n, 128, bits, device=torch.device("cuda"))
    x = torch.randn(m, k, device="cuda").to(dtype)
    out = w4a16_gemm(x, pack_swapab(q, bits).cuda(), scales.to(dtype), zeros.to(dtype), 128,
                     bits, path="swapab", **tuning)
    scales, zeros = scales.to(dtype), zeros.to(dtype)
    assert _rel_err(out, w4a16_gemm_ref(x, qweight, scales, zeros, 128, bits)) < 1e-2


@pytest.mark.gpu
def test_inside_a_cuda_graph_gpu():
    """Split-K counters come back to zero inside a graph, replay after replay."""
    q, qweight, scales, zeros = _weights(4096, 1024, 128, 4, device=torch.device("cuda"))
    packed = pack_swapab(q, 4).cuda()
    scales, zeros = scales.bfloat16(), zeros.bfloat16()
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda x: w4a16_gemm(x, packed, scales, zeros, 128, 4, path="swapab"),
                        lambda x: w4a16_gemm_ref(x, qweight, scales, zeros, 128, 4), x)


def _run_pair_ptx(code: str, pairs: torch.Tensor) -> torch.Tensor:
    """Evaluate one of the kernel's inline-PTX strings (the few instructions they use) on int32
    registers holding two int16 containers each: the CPU interpreter cannot run inline asm, so
    the strings are checked here and the kernel's GPU tests run them for real."""
    import re

    regs = {"$1": pairs.to(torch.int64) & 0xFFFFFFFF}

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else torch.full_like(pairs, int(tok, 0), dtype=torch.int64)

    def halves(v, dtype):
        lo = (v & 0xFFFF).to(torch.int16)
        hi = ((v >> 16) & 0xFFFF).to(torch.int16)
        return lo.view(dtype).float(), hi.view(dtype).float()

    def pack(lo, hi, dtype):
        lo = lo.to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
        hi = hi.to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
        return lo | (hi << 16)

    for ins in code.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        if op == "mov.b32":
            regs[dst] = val(src[0])
        elif op == "shr.b32":
            regs[dst] = val(src[0]) >> int(src[1])
        elif op == "lop3.b32":
            lut = int(src[3], 0)
            assert lut in (0xEA, 0x6A)  # (a & b) | c, (a & b) ^ c
            ab = val(src[0]) & val(src[1])
            regs[dst] = ab | val(src[2]) if lut == 0xEA else ab ^ val(src[2])
        elif (m := re.fullmatch(r"sub\.rn\.(bf16|f16)x2", op)):
            dtype = torch.bfloat16 if m.group(1) == "bf16" else torch.float16
            a, b = halves(val(src[0]), dtype), halves(val(src[1]), dtype)
            regs[dst] = pack(a[0] - b[0], a[1] - b[1], dtype)  # exact: small integers
        elif op == "fma.rn.bf16x2":
            a, b, c = (halves(val(t), torch.bfloat16) for t in src)
            # exact here (integers of at most 8 significant bits): no rounding to model
            regs[dst] = pack(a[0] * b[0] + c[0], a[1] * b[1] + c[1], torch.bfloat16)
        else:
            raise AssertionError(f"unexpected PTX {ins!r}")
    return regs["$0"]


@pytest.mark.parametrize("table,bits,dtype,bias", [
    ("BF16_4", 4, torch.bfloat16, 128.0), ("F16_4", 4, torch.float16, 0.0),
    ("F16_8", 8, torch.float16, 0.0), ("BF16_8", 8, torch.bfloat16, -128.0)])
def test_inline_ptx_dequantizes_every_value(table, bits, dtype, bias):
    from octavo.kernels import w4a16_swapab

    codes = [getattr(c, "value", c) for c in getattr(w4a16_swapab, table)]
    lo = torch.arange(2**16, dtype=torch.int64)
    hi = lo[torch.randperm(2**16, generator=torch.Generator().manual_seed(0))]
    out = [_run_pair_ptx(code, lo | (hi << 16)) for code in codes]
    for c, o in enumerate(out):
        for half, src in ((o & 0xFFFF, lo), ((o >> 16) & 0xFFFF, hi)):
            got = half.to(torch.int16).view(dtype).float()
            want = ((src >> (c * bits)) & ((1 << bits) - 1)).float() + bias
            assert torch.equal(got, want), (table, c)
