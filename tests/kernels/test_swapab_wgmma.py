"""The warp-specialized CUDA GEMM for large 4- and 8-bit batches (octavo/kernels/swapab_wgmma.py):
its plan, build and emulation at both widths, its 4-bit GPU checks (8-bit ones:
test_swapab_wgmma_8bit.py).

On the CPU: the source builds for sm_90a without spills where nvcc is, and an emulation of the
kernel's index arithmetic (the producer's swizzled copies, the consumers' words and A
fragments, wgmma's descriptor and fragment layouts as the PTX ISA defines them, the epilogue)
computes x @ dequant(W). On the GPU: against the dequantize-then-matmul path at Llama-8B
shapes, in a CUDA graph, and through the engine's routing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo import envs
from octavo.kernels import cuda_module, swapab_wgmma
from octavo.kernels.triton_utils import num_compute_units
from octavo.kernels.w4a16_swapab import pack_swapab
from tests.kernels.swapab_wgmma_emulation import (
    FORMS,
    dequant_ref,
    emulate,
    needs_gpu,
    weights,
)


def test_supports_and_plan():
    assert swapab_wgmma.supports(4096, 28672, 128, 4, torch.bfloat16, torch.float16)
    assert swapab_wgmma.supports(4096, 28672, 128, 8, torch.bfloat16, torch.bfloat16)
    assert not swapab_wgmma.supports(4096, 28672, 128, 3, torch.bfloat16, torch.bfloat16)
    assert not swapab_wgmma.supports(4096, 28672 + 128, 128, 8, torch.bfloat16, torch.bfloat16)
    # The ring: 4 stages of x [128 x 64], the packed rows (4-bit 64, 8-bit 128 of 64 int16s)
    # and a group's 256 scales and zeros, within the 227 KB an H100 CTA may have.
    assert swapab_wgmma.shared_bytes(4) == 4 * (16384 + 8192 + 1024) + 1024 + 64
    assert swapab_wgmma.shared_bytes(8) == 4 * (16384 + 16384 + 1024) + 1024 + 64 <= 227 * 1024
    assert swapab_wgmma.supports(4096, 28672, 128, 4, torch.float16, torch.float16)
    assert not swapab_wgmma.supports(4096, 28672, 128, 4, torch.float16, torch.bfloat16)
    assert not swapab_wgmma.supports(4096, 28672, 128, 4, torch.float32, torch.float32)
    assert not swapab_wgmma.supports(4096, 28672, 32, 4, torch.bfloat16, torch.bfloat16)
    assert not swapab_wgmma.supports(4096, 28672 + 128, 128, 4, torch.bfloat16, torch.bfloat16)
    assert not swapab_wgmma.available(torch.device("cpu"))
    dev = torch.device("cpu")
    sms = num_compute_units(dev)
    assert swapab_wgmma.plan(256, 256 * sms, 4096, dev) == (1, 4096)  # the tiles fill the SMs
    for m, n, k in ((256, 4096, 14336), (129, 6144, 4096), (1, 256, 128), (256, 4096, 4096)):
        splits, per = swapab_wgmma.plan(m, n, k, dev)
        tiles = n // 256 * -(-m // 128)
        assert per % 64 == 0 and (splits - 1) * per < k <= splits * per  # none empty
        assert splits == min(max(1, sms // tiles), k // 64, 16) or splits < k // 64


def test_worth_takes_the_layers_it_was_measured_faster_on(monkeypatch):
    """On 132 SMs (an H100) at 129-256 rows: with the partials summed by a second launch (the
    default) every Llama-8B layer: gate_up (its tiles fill the SMs), down (4 splits of 56
    steps), qkv / o (splits of 16-32 steps); with the last CTA's sum gate_up and down only.
    Never unsplit tiles that leave SMs idle past one row of tiles; always one row of tiles
    (gate_up at 128 rows: 112 tiles)."""
    from octavo.kernels import split_k

    monkeypatch.setattr(split_k, "num_compute_units", lambda device: 132)
    monkeypatch.setattr(swapab_wgmma, "num_compute_units", lambda device: 132)
    monkeypatch.delenv("OCTAVO_INT_LARGE_SPLIT_SUM", raising=False)
    monkeypatch.delenv("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", raising=False)
    dev = torch.device("cpu")
    for m in (129, 256):
        for n, k in ((28672, 4096), (4096, 14336), (6144, 4096), (4096, 4096)):
            assert swapab_wgmma.worth(m, n, k, dev), (m, n, k)
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "cta")
    for m in (129, 256):
        assert swapab_wgmma.worth(m, 28672, 4096, dev)
        assert swapab_wgmma.worth(m, 4096, 14336, dev)
        assert not swapab_wgmma.worth(m, 6144, 4096, dev)
        assert not swapab_wgmma.worth(m, 4096, 4096, dev)
    assert swapab_wgmma.plan(384, 6144, 4096, dev)[0] == 1
    assert not swapab_wgmma.worth(384, 6144, 4096, dev)  # 72 tiles, unsplit
    assert swapab_wgmma.plan(128, 28672, 4096, dev)[0] == 1
    assert swapab_wgmma.worth(128, 28672, 4096, dev)  # 112 tiles, but one row of them
    assert swapab_wgmma.worth(64, 28672, 4096, dev)
    # OCTAVO_INT_LARGE_MIN_SPLIT_STEPS moves the split line (qkv: 2 splits of 32 steps, o: 4
    # of 16), never the unsplit rule.
    monkeypatch.setenv("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", "32")
    assert swapab_wgmma.worth(256, 6144, 4096, dev)
    assert not swapab_wgmma.worth(256, 4096, 4096, dev)
    monkeypatch.setenv("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", "16")
    assert swapab_wgmma.worth(256, 4096, 4096, dev)
    assert not swapab_wgmma.worth(384, 6144, 4096, dev)
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "launch")
    monkeypatch.setenv("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", "48")
    assert not swapab_wgmma.worth(256, 4096, 4096, dev)
    monkeypatch.setenv("OCTAVO_INT_LARGE_MIN_SPLIT_STEPS", "-3")
    with pytest.raises(ValueError, match="OCTAVO_INT_LARGE_MIN_SPLIT_STEPS"):
        swapab_wgmma.worth(256, 4096, 4096, dev)


# Slow (47 s on CI's 2 cores for the 4-bit forms alone; 80 s here with the 8-bit ones of
# session 64): its GPU tests build it; run this with OCTAVO_SKIP_SLOW=0 after touching it.
@pytest.mark.slow
@pytest.mark.skipif(cuda_module.nvcc_path() is None, reason="needs nvcc")
def test_the_source_builds_for_sm_90a_without_spills_or_serialized_mmas(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    outputs = []
    real_run = cuda_module.subprocess.run

    def run(cmd, **kw):
        proc = real_run(cmd, **kw)
        outputs.append(proc.stderr or "")
        return proc

    monkeypatch.setattr(cuda_module.subprocess, "run", run)
    cubin = cuda_module.build(swapab_wgmma.SOURCE, "sm_90a", extra=("-Xptxas", "-v"))
    data = cubin.read_bytes()
    report = "".join(outputs)
    names = [f"swapab_wgmma{bits}_{scales}_scales{math}{deep}" for bits in ("", "8")
             for scales in ("bf16", "f16") for math in ("", "_bf16_math") for deep in ("", "_deep")]
    names += [f"swapab_wgmma{bits}_f16_act{math}{deep}" for bits in ("", "8")
              for math in ("", "_half_math") for deep in ("", "_deep")]  # fp16 activations
    for name in names:  # every form the wrapper can name
        assert name.encode() in data, name
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert len(spills) == len(names) and all(s == "0" for s in spills), report[-2000:]
    assert "serialized" not in report, report[-2000:]
    # Each form waits as deep as it claims (a compiler that serialized the MMAs would not).
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        return
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    for function in sass.split("Function : ")[1:]:
        name = function.split()[0]
        depth = 2 if name.endswith("_deep") else 1
        waits = set(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", function))
        assert waits == {hex(depth), "0x0"}, (name, waits)


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit or the one Triton ships, if either is here."""
    import shutil

    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    return str(path) if path.exists() else None


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_the_one_ffma_dequantization_is_exact(scale_dtype):
    """0x41800000 | q << 19 is the float 16 + q, c = -(16 + z) s is exact in float32, and the
    fused fma(16 + q, s, c) (exact product, one rounding) equals (q - z) s computed in float32:
    the kernel's one instruction a weight gives the serial path's values."""
    q = np.arange(16, dtype=np.uint32)
    assert np.array_equal(((q << 19) | 0x41800000).view(np.float32), 16.0 + q)
    g = torch.Generator().manual_seed(0)
    s = torch.cat([torch.rand(4000, generator=g) * 0.05, torch.rand(1000, generator=g) * 40])
    s = s.to(scale_dtype).float().numpy()
    z = np.arange(17, dtype=np.float32)
    qs, zs, ss = np.meshgrid(q.astype(np.float32), z, s, indexing="ij")
    c = (-(zs + 16) * ss).astype(np.float32)
    assert np.array_equal(c.astype(np.float64), -(zs.astype(np.float64) + 16) * ss)  # exact
    fused = ((qs.astype(np.float64) + 16) * ss + c).astype(np.float32)
    assert np.array_equal(fused, ((qs - zs) * ss).astype(np.float32))


def _kernel_source() -> str:
    return (Path(cuda_module.SOURCE_DIR) / swapab_wgmma.SOURCE).read_text()


def test_the_emulated_formulas_are_the_source_s():
    """The emulation transcribes these lines of the kernel: a change there must change it."""
    src = _kernel_source()
    for line in (
        "const int pr = p >> 3, pj = p & 7;",
        "const uint32_t dst = pr * 128 + ((pj ^ (pr & 7)) << 4);",
        "const int x_rows = max(0, min(8, (pb.m - m0 - pr + 15) / 16));",
        "cp_async16(xs + dst + u * 2048, (in ? x_src + u * x_step : x_last) + koff, in ? 16 : 0);",
        "cp_async16(xs + kXBytes + dst + u * 2048, q_src + u * q_step + koff, 16);",
        "for (int u = 0; u < kPackedRows<kBits> / 16; ++u) {",
        "pb.qw + static_cast<size_t>(t * kPackedRows<kBits> + pr) * pb.k + k_begin + pj * 8;",
        "constexpr int kPackedRows = kBits == 4 ? kRows : 2 * kRows;",
        "constexpr int kShift = kBits == 4 ? 8 * kWg : 0;",
        "constexpr int kValueBits = kBits == 4 ? 4 : 8;",
        "constexpr int kRowBase = kBits == 4 ? 0 : kWg * kRows * 128;",
        "constexpr float kFloatBias = kBits == 4 ? 16.0f : 256.0f;",
        "constexpr float kPackedBias = kBits == 4 ? Act<T>::kBiasValue : Act<T>::kByteBias;",
        "static constexpr float kByteBias = -128.0f;", "static constexpr float kByteBias = 1024.0f;",
        "constexpr int kTo = 23 - kBits;",
        "return word << (kTo - kFrom);", "return word >> (kFrom - kTo);",
        "uint32_t t = packed_values<kBits, kShift, T>(word);",
        'asm("prmt.b32 %0, %1, %2, %3;\\n"',
        ': "=r"(r) : "r"(word), "r"(0x64646464u), "n"(kShift ? 0x4341 : 0x4240));',
        'asm("lop3.b32 %0, %1, %2, %3, 0xea;\\n" : "=r"(lo) : "r"(v), "n"(0x007F007F), "n"(0x43004300));',
        'asm("lop3.b32 %0, %1, %2, %3, 0x6a;\\n" : "=r"(y) : "r"(v), "n"(0x00800080), "n"(0x43804380));',
        'asm("fma.rn.bf16x2 %0, %1, %2, %3;\\n" : "=r"(r) : "r"(y), "r"(0xBF80BF80u), "r"(lo));',
        "const S* sz_src = (p < 32 ? pb.scales : pb.zeros) + t * kRows * 4 + (p & 31) * 8;",
        "cp_async16(xs + kXBytes + kPBytes<kBits> + (p >> 5) * kSBytes + (p & 31) * 16,",
        "sz_src + static_cast<size_t>(g) * pb.n, 16);",
        "const int g = (k_begin + koff) / pb.group;",
        "const int lcol0 = 2 * kWg * kRows + r0;",
        "load_sz<kBits, S>(ps + kPBytes<kBits>, lcol0, s_cur, c_cur);",
        "const S* zeros = reinterpret_cast<const S*>(sz + kSBytes);",
        "const int r0 = 16 * (warp & 3) + (lane >> 2);",
        "const int kq = (lane & 3) * 2;",
        "consume<kBits, 0, kBf16Math, kInFlight, T, S>(", "consume<kBits, 1, kBf16Math, kInFlight, T, S>(",
        "if (warp < 8) {",
        "const int col0 = t * kRows * 4 + lcol0;",
        "for (int c = 0; c < 8; ++c) off[c] = r0 * 128 + ((c ^ (r0 & 7)) << 4) + kq * 2;",
        "ps + kRowBase + off[2 * kk + (q >> 1)] + (q & 1) * 1024);",
        "ak[0][q] = dequant_pair<kBits, kShift, T>(word, c_cur[i_row], s_cur[i_row], bias);",
        "ak[1][q] = dequant_pair<kBits, kShift + kValueBits, T>(word, c_cur[2 + i_row],",
        "const float lo = with_bias<kBits>(value_at<kBits, kShift>(word), bias);",
        "const float hi = with_bias<kBits>(value_at<kBits, 16 + kShift>(word), bias);",
        'asm("lop3.b32 %0, %1, %2, %3, 0xea;\\n" : "=r"(out) : "r"(moved), "n"(kMask), "r"(bias));',
        "constexpr uint32_t kMask = ((1u << kBits) - 1) << (23 - kBits);  // 0x00780000, 0x007F8000",
        "const uint32_t bias = kBits == 4 ? 0x41800000u : 0x43800000u;  // 2^kBits as a float",
        "typename Act<T>::T2 w = Act<T>::pair(fmaf(lo, s, c), fmaf(hi, s, c));",
        "return __floats2bfloat162_rn(lo, hi);", "return __floats2half2_rn(lo, hi);",
        "c[i] = -(to_float(zeros[col]) + kFloatBias<kBits>) * s[i];",
        "const uint64_t desc = smem_desc(xs + kk * 32);",
        "const uint32_t moved = kShift == 0 ? word : word >> kShift;",
        'asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xea;\\n" : "=r"(r) : "r"(moved), "r"(Act<T>::kBias));',
        "T2 v = __hmul2(__hadd2(*reinterpret_cast<T2*>(&t), *reinterpret_cast<T2*>(&zb)),",
        "static constexpr uint32_t kBias = 0x43004300u;",
        "static constexpr float kBiasValue = 128.0f;",
        "static constexpr uint32_t kBias = 0x64006400u;",
        "static constexpr float kBiasValue = 1024.0f;",
        "typename Act<T>::T2 sv = Act<T>::both(to_act<T>(scales[col]));",
        "Act<T>::both(Act<T>::round(-(to_float(zeros[col]) + kPackedBias<kBits, T>)));",
        "ak[0][q] = dequant_pair_packed<kBits, kShift, T>(word, zb_cur[i_row], sb_cur[i_row]);",
        "ak[1][q] = dequant_pair_packed<kBits, kShift + kValueBits, T>(",
        "word, zb_cur[2 + i_row], sb_cur[2 + i_row]);",
        "desc |= static_cast<uint64_t>(1024 >> 4) << 32;",
        "desc |= static_cast<uint64_t>(1) << 62;",
        "const int col = lcol0 + (i >> 1) * 64 + (i & 1) * 8;",
        "const int row = row0 + 8 * j + (e & 1);",
        "out[static_cast<size_t>(row) * stride_om + col + 8 * (e >> 1)] =",
        "store_tile<false, T>(acc1, pb.out, nullptr, pb.m, pb.n, m0 + kq, col0 + kRows,",
        "const int k_begin = blockIdx.z * pb.k_per_split;",
        "const int k_end = min(pb.k, k_begin + pb.k_per_split);",
        "const int steps = (k_end - k_begin) / kStepK;",
        "const int koff = i * kStepK;",
        "for (int z = 0; z < splits; ++z) {",
        "if (row0 + 8 * j + (e & 1) < m) sum[4 * j + e] += __ldcg(p + (e & 1) * n + 8 * (e >> 1));",
    ):
        assert line in src, line


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bf16_math", [False, True])
@pytest.mark.parametrize("act,scale_dtype,splits", [
    (torch.bfloat16, torch.bfloat16, 1), (torch.bfloat16, torch.float16, 2),
    (torch.float16, torch.float16, 1), (torch.float16, torch.float16, 2)])
def test_the_emulated_kernel_computes_x_at_the_dequantized_weight(act, scale_dtype, splits,
                                                                  bf16_math, bits):
    """The float form takes the scales as they are; the packed form rounds scales of another
    type to the activations' first (scales of their type: the same values both ways). fp16
    activations: the weights rounded to fp16, the packed pairs from 1024 + q. 8-bit: the
    CTA's two layout blocks, one a warpgroup."""
    k, n, group, m = 128, 256, 64, 131  # two K steps, two groups, two batch tiles (a tail)
    q, packed, scales, zeros = weights(k, n, group, dtype=scale_dtype, bits=bits)
    x = torch.randn(m, k).to(act)
    got = emulate(x, packed, scales, zeros, group, splits, bf16_math, bits)
    used = scales.to(act) if bf16_math else scales
    want = x.float() @ dequant_ref(q, used, zeros, group, act).float()
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_the_packed_fp16_dequantization_is_the_float_form_s():
    """Half2: 0x6400 | q is fp16 1024 + q, adding -(1024 + z) is exact, and the product with an
    fp16 scale rounds once, to the float form's (q - z) * s rounded to fp16, for every q, z
    and a spread of scales."""
    q = np.arange(16, dtype=np.uint16)
    assert np.array_equal((q | 0x6400).view(np.float16).astype(np.float32), 1024.0 + q)
    g = torch.Generator().manual_seed(0)
    s = torch.cat([torch.rand(2000, generator=g) * 0.05, torch.rand(500, generator=g) * 40])
    s = s.to(torch.float16)
    qs = torch.arange(16, dtype=torch.float16)[:, None, None]
    zs = torch.arange(17, dtype=torch.float16)[None, :, None]
    packed = ((qs + 1024) + (-(zs + 1024))) * s[None, None, :]  # fp16 ops, as __hadd2 / __hmul2
    want = ((qs.float() - zs.float()) * s.float()[None, None, :]).to(torch.float16)
    assert torch.equal(packed, want)


# --- On the GPU (the most telling first: a failure's message locates it) ---------------

@needs_gpu
@pytest.mark.gpu
@FORMS
@pytest.mark.parametrize("bits", [4, 8])
def test_one_hot_rows_read_back_the_weight_gpu(bf16_math, deep, bits):
    """x's row m is one-hot at k = (3 m) % K and q[k, n] = (k + 5 n) % 2^bits (scale 1, zero
    0), so out[m, n] is q[(3 m) % K, n] exactly. A wrong fragment, swizzle, epilogue index or
    (8-bit) block, byte or row base shows in the failure message as where the wrong values
    came from (a value v at (m, n) is some (k, n') with (k + 5 n') % 2^bits == v)."""
    k, n, m = 256, 512, 200
    kk = torch.arange(k)[:, None]
    q = (kk + 5 * torch.arange(n)[None, :]) % 2**bits
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    x[torch.arange(m), (3 * torch.arange(m)) % k] = 1
    scales = torch.ones(k // 64, n, dtype=torch.bfloat16)
    zeros = torch.zeros(k // 64, n, dtype=torch.bfloat16)
    got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q, bits).cuda(), scales.cuda(),
                                    zeros.cuda(), 64, bits, bf16_math=bf16_math,
                                    deep=deep).float().cpu()
    want = q[(3 * torch.arange(m)) % k].float()
    bad = (got != want).nonzero()
    assert len(bad) == 0, (f"{len(bad)} of {got.numel()} wrong; first (m, n, got, want): "
                           + str([(int(a), int(b), float(got[a, b]), float(want[a, b]))
                                  for a, b in bad[:12]]))


@needs_gpu
@pytest.mark.gpu
@FORMS
def test_exact_on_integer_data_gpu(bf16_math, deep):
    """Small integers everywhere: every product and sum is exact in float32, so any slip in
    a fragment, a swizzle or a buffer's reuse shows as a nonzero difference."""
    k, n, m = 1024, 4096, 256
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (k, n), generator=g)
    scales = torch.ones(k // 64, n, dtype=torch.bfloat16)
    zeros = torch.full((k // 64, n), 8.0, dtype=torch.bfloat16)
    x = torch.randint(-2, 3, (m, k), generator=g).to(torch.bfloat16)
    got = swapab_wgmma.swapab_wgmma(x.cuda(), pack_swapab(q, 4).cuda(), scales.cuda(),
                                    zeros.cuda(), 64, 4, bf16_math=bf16_math, deep=deep)
    want = x.float() @ (q.float() - 8.0)
    assert torch.equal(got.float().cpu(), want.to(torch.bfloat16).float())


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n", [(4096, 28672), (14336, 4096), (4096, 6144), (4096, 4096)])
@FORMS
def test_llama_shapes_gpu(k, n, scale_dtype, bf16_math, deep):
    """Every batch size and K split on one weight (made once: the shapes are large)."""
    q, packed, scales, zeros = weights(k, n, 128, dtype=scale_dtype, device="cuda")
    w = dequant_ref(q, scales, zeros, 128).float()
    errors = {}
    for m in (1, 129, 200, 256, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.float() @ w
        for split_k in (None, 1, 3):
            got = swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4,
                                            split_k=split_k, bf16_math=bf16_math,
                                            deep=deep).float()
            errors[m, split_k] = ((got - want).norm() / want.norm()).item()
    assert all(e < 5e-3 for e in errors.values()), errors


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("k,n,m", [(14336, 4096, 256), (4096, 6144, 129), (4096, 4096, 200)])
def test_the_launch_sum_gives_the_last_cta_s_bits_gpu(k, n, m, monkeypatch):
    """OCTAVO_INT_LARGE_SPLIT_SUM: the partials summed by a second launch (split_sum) give the
    output the last CTA's sum gives, at every split, also under graph replays, where the
    counters go unused."""
    from tests.quantization.gemm_checks import check_graph_replays

    q, packed, scales, zeros = weights(k, n, 128, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for split_k in (None, 2, 3, 4, 5, 8, 9):
        want = swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4, split_k=split_k,
                                         split_sum="cta")
        got = swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4, split_k=split_k,
                                        split_sum="launch")
        assert torch.equal(got, want), split_k
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "launch")
    w = dequant_ref(q, scales, zeros, 128).float()
    check_graph_replays(
        lambda x: swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4, split_k=4),
        lambda x: (x.float() @ w), x)


def test_split_sum_names_are_checked(monkeypatch):
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "atomic")
    with pytest.raises(ValueError, match="OCTAVO_INT_LARGE_SPLIT_SUM"):
        envs.int_large_split_sum()
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "cluster")  # measured slower, removed
    with pytest.raises(ValueError, match="cta or launch"):
        envs.int_large_split_sum()
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", " CTA ")
    assert envs.int_large_split_sum() == "cta"
    monkeypatch.delenv("OCTAVO_INT_LARGE_SPLIT_SUM")
    assert envs.int_large_split_sum() == "launch"
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="split_sum"):  # before any device work
        swapab_wgmma.swapab_wgmma(x, torch.zeros(64, 64, dtype=torch.int16),
                                  torch.ones(1, 256, dtype=torch.bfloat16),
                                  torch.zeros(1, 256, dtype=torch.bfloat16), 64, 4,
                                  split_sum="atomic")


@needs_gpu
@pytest.mark.gpu
def test_graph_replays_and_routing_gpu(monkeypatch):
    from octavo.kernels import int_weight_layout
    from tests.quantization.gemm_checks import check_graph_replays, record_rows

    q, packed, scales, zeros = weights(4096, 28672, 128, dtype=torch.float16, device="cuda")
    w = dequant_ref(q, scales, zeros, 128).float()
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    check_graph_replays(lambda x: swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4),
                        lambda x: (x.float() @ w), x)
    check_graph_replays(  # K split in 4: the tickets' counters zeroed again every replay
        lambda x: swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4, split_k=4),
        lambda x: (x.float() @ w), x)
    calls = record_rows(monkeypatch, swapab_wgmma, "swapab_wgmma")
    monkeypatch.delenv("OCTAVO_INT_LARGE_MAX_M", raising=False)  # the defaults: on, to 256
    monkeypatch.delenv("OCTAVO_INT_LARGE_MIN_M", raising=False)
    monkeypatch.delenv("OCTAVO_INT_LARGE_CUDA", raising=False)
    monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "cta")
    for m in (64, 65, 200, 300):  # from LARGE_MIN_M (65) to LARGE_MAX_M (256) rows
        xm = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        got = int_weight_layout.linear(xm, packed, scales, zeros, 128, 4,
                                       int_weight_layout.SWAPAB)
        assert ((got.float() - xm.float() @ w).norm() / (xm.float() @ w).norm()) < 1e-2
    assert calls == [65, 200]
    del calls[0]
    if swapab_wgmma.num_compute_units(torch.device("cuda")) >= 96:  # qkv-shaped: K split
        q_small, small, s_small, z_small = weights(4096, 6144, 128, device="cuda")  # in 32-step
        xm = torch.randn(200, 4096, device="cuda", dtype=torch.bfloat16)  # parts: not worth
        int_weight_layout.linear(xm, small, s_small, z_small, 128, 4, int_weight_layout.SWAPAB)
        assert calls == [200]
        monkeypatch.setenv("OCTAVO_INT_LARGE_SPLIT_SUM", "launch")  # the default: worth it
        got = int_weight_layout.linear(xm, small, s_small, z_small, 128, 4,
                                       int_weight_layout.SWAPAB)
        assert calls == [200, 200]
        want = xm.float() @ dequant_ref(q_small, s_small, z_small, 128).float()
        assert ((got.float() - want).norm() / want.norm()) < 1e-2
    monkeypatch.setenv("OCTAVO_INT_LARGE_MIN_M", "64")  # the kernel from 64 rows too
    xm = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    got = int_weight_layout.linear(xm, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB)
    assert ((got.float() - xm.float() @ w).norm() / (xm.float() @ w).norm()) < 1e-2
    assert calls[-1] == 64


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(4096, 28672), (14336, 4096), (4096, 6144)])
@pytest.mark.parametrize("deep", [False, True])
def test_fp16_activations_gpu(k, n, deep):
    """float16 models (fp16 activations and scales): the float and the half2 forms give the
    same bits (the same weights into the same MMAs), close to x at the weight rounded to
    fp16, at every batch size and K split, with either split sum."""
    q, packed, scales, zeros = weights(k, n, 128, dtype=torch.float16, device="cuda")
    w = dequant_ref(q, scales, zeros, 128, torch.float16).float()
    errors = {}
    for m in (1, 65, 129, 256):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        want = x.float() @ w
        for split_k in (None, 1, 3):
            forms = [swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4, split_k=split_k,
                                               bf16_math=b, deep=deep, split_sum=u)
                     for b, u in ((False, "launch"), (True, "launch"), (True, "cta"))]
            assert all(f.dtype == torch.float16 for f in forms)
            assert torch.equal(forms[0], forms[1]) and torch.equal(forms[1], forms[2]), \
                (m, split_k)
            errors[m, split_k] = ((forms[0].float() - want).norm() / want.norm()).item()
    assert all(e < 5e-3 for e in errors.values()), errors


@needs_gpu
@pytest.mark.gpu
def test_fp16_routing_waits_for_its_switch_gpu(monkeypatch):
    """OCTAVO_INT_LARGE_F16: float16 batches take the kernel unless it is 0; graph replays."""
    from octavo.kernels import int_weight_layout
    from tests.quantization.gemm_checks import check_graph_replays, record_rows

    q, packed, scales, zeros = weights(4096, 28672, 128, dtype=torch.float16, device="cuda")
    w = dequant_ref(q, scales, zeros, 128, torch.float16).float()
    x = torch.randn(200, 4096, device="cuda", dtype=torch.float16)
    check_graph_replays(lambda x: swapab_wgmma.swapab_wgmma(x, packed, scales, zeros, 128, 4),
                        lambda x: (x.float() @ w), x)
    calls = record_rows(monkeypatch, swapab_wgmma, "swapab_wgmma")
    monkeypatch.setenv("OCTAVO_INT_LARGE_F16", "0")
    int_weight_layout.linear(x, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB)
    assert calls == []
    monkeypatch.delenv("OCTAVO_INT_LARGE_F16", raising=False)
    got = int_weight_layout.linear(x, packed, scales, zeros, 128, 4, int_weight_layout.SWAPAB)
    assert calls == [200]
    assert ((got.float() - x.float() @ w).norm() / (x.float() @ w).norm()) < 5e-3


