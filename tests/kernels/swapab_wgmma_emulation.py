"""The shared parts of the CUDA large-batch kernel's tests (test_swapab_wgmma.py, 4-bit and
both widths; test_swapab_wgmma_8bit.py): weights and their reference dequantization, the GPU
marks, and a numpy emulation of the kernel's index arithmetic (cuda/swapab_wgmma.cu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.kernels import cuda_module, swapab_wgmma
from octavo.kernels.w4a16_swapab import pack_swapab

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
    or cuda_module.nvcc_path() is None, reason="needs an sm_90 GPU and nvcc")

# The kernel's forms: float or bf16x2 dequantization, one or two MMA groups in flight.
FORMS = pytest.mark.parametrize("bf16_math,deep", [(False, False), (True, False),
                                                     (False, True), (True, True)])


def weights(k, n, group, seed=0, dtype=torch.bfloat16, device="cpu", bits=4):
    """(q [K, N], packed, scales, zeros), made on ``device`` (Llama-sized ones in seconds);
    zero points to 2^bits (GPTQ's stored zeros plus one reach it)."""
    g = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=g, device=device)
    scales = (torch.rand(k // group, n, generator=g, device=device) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 2**bits + 1, (k // group, n), generator=g,
                          device=device).to(dtype)
    return q, pack_swapab(q, bits), scales, zeros


def dequant_ref(q, scales, zeros, group, dtype=torch.bfloat16):
    """[K, N] float32 -> (q - z) * s in float32, rounded once to ``dtype``
    (dequantize_swapab)."""
    s = scales.float().repeat_interleave(group, 0)
    z = zeros.float().repeat_interleave(group, 0)
    return ((q.float() - z) * s).to(dtype)


# --- An emulation of the kernel's index arithmetic (cuda/swapab_wgmma.cu), on numpy ---------

ROWS, BATCH, STEP_K = swapab_wgmma.ROWS, swapab_wgmma.BATCH, swapab_wgmma.STEP_K
X_BYTES = BATCH * STEP_K * 2
S_BYTES = ROWS * 4 * 2


def _packed_rows(bits):
    """int16 rows of the layout a CTA reads: one 64-row block of 4-bit rows, two of 8-bit."""
    return ROWS if bits == 4 else 2 * ROWS


def _swizzled(r, j):
    """The byte offset of 16-byte piece j of 128-byte row r (piece j ^ (r % 8))."""
    return r * 128 + ((j ^ (r & 7)) << 4)


def _desc_b(smem: np.ndarray, start: int, n_cols: int) -> np.ndarray:
    """wgmma's B operand [16 x n_cols] (bf16 bits) read through a K-major, 128-byte swizzled
    descriptor at byte ``start`` (SBO 1024): element (k, n) at start + (n // 8) * 1024 +
    (n % 8) * 128 + 2 k, with address bits 4-6 XORed with bits 7-9."""
    out = np.zeros((16, n_cols), dtype=np.uint16)
    for n in range(n_cols):
        for k in range(16):
            addr = start + (n // 8) * 1024 + (n % 8) * 128 + 2 * k
            addr ^= ((addr >> 7) & 7) << 4
            out[k, n] = int(smem[addr]) | (int(smem[addr + 1]) << 8)
    return out


def _bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def emulate(x, packed, scales, zeros, group, splits=1, bf16_math=False, bits=4):
    """out [M, N] as the kernel computes it, CTA by CTA, thread by thread (float32 sums); with
    K splits, each split's partials then their sum in split order."""
    k = x.shape[1]
    per = -(-(k // STEP_K) // splits) * STEP_K
    parts = [_emulate_split(x, packed, scales, zeros, group, z * per, min(k, z * per + per),
                            bf16_math, bits)
             for z in range(-(-k // per))]
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    return out


def _emulate_split(x, packed, scales, zeros, group, k_begin, k_end, bf16_math=False, bits=4):
    m, k = x.shape
    n = packed.shape[0] * (16 // bits)
    rows = _packed_rows(bits)
    p_bytes = rows * STEP_K * 2
    act = x.dtype  # the activations' type T: the MMA's inputs and the A pairs' rounding

    def rnd(values):  # float32 values rounded to T, back as float32
        return torch.from_numpy(np.asarray(values, np.float32)).to(act).float().numpy()

    def act_bits(bits):
        return (_bf16_bits_to_float(bits) if act == torch.bfloat16
                else bits.view(np.float16).astype(np.float32))

    # The packed forms' bias (kPackedBias): 4-bit Act<T>::kBiasValue, 8-bit Act<T>::kByteBias;
    # the float forms' (kFloatBias): 16 + q, 256 + q.
    if bits == 4:
        bias = 128.0 if act == torch.bfloat16 else 1024.0
    else:
        bias = -128.0 if act == torch.bfloat16 else 1024.0
    float_bias = 16.0 if bits == 4 else 256.0
    mask = (1 << bits) - 1
    x_bits = x.view(torch.int16).numpy().view(np.uint16)
    p_bits = packed.numpy().view(np.uint16)
    s_bits = scales.view(torch.int16).numpy().view(np.uint16)
    z_bits = zeros.to(scales.dtype).view(torch.int16).numpy().view(np.uint16)
    to_float = (_bf16_bits_to_float if scales.dtype == torch.bfloat16
                else lambda b: b.view(np.float16).astype(np.float32))
    out = np.full((m, n), np.nan, dtype=np.float32)
    for t in range(n // (ROWS * 4)):
        for by in range(-(-m // BATCH)):
            m0 = by * BATCH
            acc = np.zeros((2, 2, ROWS, BATCH), dtype=np.float32)  # [warpgroup, value]
            for i in range((k_end - k_begin) // STEP_K):
                k0 = k_begin + i * STEP_K
                smem = np.full(X_BYTES + p_bytes + 2 * S_BYTES, 0xAB, dtype=np.uint8)
                gi = k0 // group
                for p in range(128):  # the producer's copies, thread by thread
                    pr, pj = p >> 3, p & 7
                    dst = pr * 128 + ((pj ^ (pr & 7)) << 4)
                    x_rows = max(0, min(8, (m - m0 - pr + 15) // 16 if m - m0 - pr > -15
                                        else 0))
                    for u in range(8):
                        row = m0 + pr + 16 * u
                        piece = (x_bits[row, k0 + 8 * pj:k0 + 8 * pj + 8] if u < x_rows
                                 else np.zeros(8, np.uint16))
                        off = dst + u * 2048
                        assert off == _swizzled(pr + 16 * u, pj)
                        smem[off:off + 16] = piece.astype("<u2").view(np.uint8)
                    for u in range(rows // 16):
                        piece = p_bits[t * rows + pr + 16 * u, k0 + 8 * pj:k0 + 8 * pj + 8]
                        off = X_BYTES + dst + u * 2048
                        smem[off:off + 16] = piece.astype("<u2").view(np.uint8)
                    if p < 64:
                        src = s_bits if p < 32 else z_bits
                        c0 = t * ROWS * 4 + (p & 31) * 8
                        off = X_BYTES + p_bytes + (p >> 5) * S_BYTES + (p & 31) * 16
                        smem[off:off + 16] = src[gi, c0:c0 + 8].astype("<u2").view(np.uint8)
                sz = smem[X_BYTES + p_bytes:].view("<u2")
                for kk in range(STEP_K // 16):
                    b = act_bits(_desc_b(smem, kk * 32, BATCH))  # [16, 128]
                    for wg in range(2):
                        a = np.zeros((2, ROWS, 16), dtype=np.float32)  # [value, row, k]
                        # consume<kBits, 0> on warps 4-7, consume<kBits, 1> on 8-11: 4-bit
                        # values 2 wg, 2 wg + 1 (kShift 8 wg); 8-bit both bytes of the
                        # CTA's block wg (kRowBase).
                        k_shift = 8 * wg if bits == 4 else 0
                        value_bits = 4 if bits == 4 else 8
                        row_base = 0 if bits == 4 else wg * ROWS * 128
                        for warp in range(4):
                            for lane in range(32):
                                r0 = 16 * warp + (lane >> 2)
                                kq = (lane & 3) * 2
                                lcol0 = 2 * wg * ROWS + r0
                                off = [r0 * 128 + ((c ^ (r0 & 7)) << 4) + kq * 2
                                       for c in range(8)]
                                for q in range(4):
                                    addr = (X_BYTES + row_base + off[2 * kk + (q >> 1)]
                                            + (q & 1) * 1024)
                                    word = int(smem[addr:addr + 4].view("<u4")[0])
                                    for v in range(2):
                                        shift = k_shift + value_bits * v
                                        col = lcol0 + v * ROWS + (q & 1) * 8
                                        s = np.float32(to_float(sz[col:col + 1])[0])
                                        z = np.float32(to_float(sz[256 + col:257 + col])[0])
                                        c = np.float32(-(z + float_bias) * s)
                                        lo = float_bias + ((word >> shift) & mask)
                                        hi = float_bias + ((word >> (16 + shift)) & mask)
                                        if bf16_math:  # (q - z) exact, times T(s) rounded
                                            sb = rnd([s])[0]
                                            zb = rnd([-(z + bias)])[0]
                                            pair = rnd([
                                                (np.float64(lo - float_bias + bias) + zb) * sb,
                                                (np.float64(hi - float_bias + bias) + zb) * sb])
                                        else:  # fma: the products exact in float64, rounded once
                                            pair = rnd([np.float64(lo) * s + c,
                                                        np.float64(hi) * s + c])
                                        # A fragment register q: (row 16 w + g + 8 (q & 1),
                                        # k 2 t + 8 (q >> 1) and + 1)
                                        ka = 2 * (lane & 3) + 8 * (q >> 1)
                                        a[v, 16 * warp + (lane >> 2) + 8 * (q & 1),
                                          ka:ka + 2] = pair
                        for v in range(2):
                            acc[wg, v] += a[v] @ b
            for wg in range(2):  # the epilogue through the D fragment layout
                for v in range(2):
                    for warp in range(4):
                        for lane in range(32):
                            r0 = 16 * warp + (lane >> 2)
                            kq = (lane & 3) * 2
                            col0 = t * ROWS * 4 + 2 * wg * ROWS + r0
                            for j in range(16):
                                for e in range(4):
                                    # D register 4 j + e: (row 16 w + g + 8 (e >> 1), column
                                    # 8 j + 2 t + (e & 1))
                                    d = acc[wg, v, 16 * warp + (lane >> 2) + 8 * (e >> 1),
                                            8 * j + 2 * (lane & 3) + (e & 1)]
                                    row = m0 + kq + 8 * j + (e & 1)
                                    if row < m:
                                        out[row, col0 + v * ROWS + 8 * (e >> 1)] = d
    return out
