"""GGUF block formats, repacked into the one layout Octavo's quantized kernels read.

Every supported format is, per block of 32 weights along the input, ``w = d * u + m`` with a
small unsigned integer ``u`` and float ``d`` (scale) and ``m`` (offset):

- Q8_0: u = q + 128, m = -128 d        - Q4_0: u = q, m = -8 d      - Q4_1: u = q, m = min
- Q5_0: u = q (5 bits), m = -16 d      - Q5_1: u = q, m = min
- Q4_K / Q5_K: each 32-weight sub-block of a 256 super-block has d = d_super * scale6 and
  m = -dmin_super * min6, so they become Q4_1 / Q5_1 blocks exactly.
- Q6_K: 16-weight sub-blocks, w = d_super * scale8 * (q - 32), so u = q (6 bits, held in a
  byte), d = d_super * scale8 and m = -32 d per group of 16 (the only format with G = 16).

The repacked layer holds ``qweight`` uint8 ``[N, K/2]`` when u < 16 (two per byte) or ``[N, K]``,
and ``scales`` / ``mins`` ``[N, K/G]``, G = 32 inputs per group (16 for Q6_K): float16 when every
value is exactly a float16 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 hold the file's own fp16 d and m, so a
4-bit layer reads 5 bits per weight, as llama.cpp does), else float32 (K-quants' d = d_super *
scale6 needs up to 17 significant bits). Nibbles are packed per 64 weights: byte j of a
64-chunk holds u[j] (low) and u[j + 32] (high), so one 32-byte load unpacks to two whole blocks;
a trailing lone block (K % 64 == 32) holds u[j] and u[j + 16].

Interleaved (``repack(..., interleave=True)``, where N % 16 == 0 and K % 64 == 0): the same bytes
and scales regrouped by 16 rows, ``qweight [N/16, row_bytes/4, 64]`` (each 64 bytes are one
4-byte run of each of the 16 rows) and ``scales`` / ``mins`` ``[N/16, K/G, 16]``, so the VNNI
kernel makes 16 outputs per pass (quant_gemm.cpp). :func:`deinterleave` undoes it.

Q2_K, Q3_K and the IQ formats are not in this layout: layers holding them are dequantized at
load instead.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 32  # weights per scale in the repacked layout (and per activation scale in kernels)
GROUP = {"Q6_K": 16}  # formats whose repacked scales cover fewer weights than BLOCK

# GGMLQuantizationType values (gguf.GGMLQuantizationType), kept here so this module needs only
# numpy: name -> (id, weights per block, bytes per block).
FORMATS = {
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}
_BY_ID = {v[0]: name for name, v in FORMATS.items()}
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")


def format_name(qtype: int) -> str | None:
    """The supported format name of a GGML type id, None when it cannot be kept quantized."""
    return _BY_ID.get(int(qtype))


def row_bytes(name: str, in_features: int) -> int:
    _, per_block, nbytes = FORMATS[name]
    if in_features % per_block:
        raise ValueError(f"{name}: {in_features} input features are not a multiple of "
                         f"{per_block}")
    return in_features // per_block * nbytes


def bits(name: str) -> int:
    return 4 if name in FOUR_BIT else 8


def group_size(name: str) -> int:
    """Inputs per scale / min of the repacked layout."""
    return GROUP.get(name, BLOCK)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def _nibbles16(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (uint32 little endian) -> 32 bits, bit j for value j, as 0/16."""
    bits_ = np.unpackbits(qh, axis=-1, bitorder="little")
    return bits_.astype(np.uint8) << 4


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of a K super-block -> 8 six-bit scales and 8 six-bit mins."""
    s = s.astype(np.uint8)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def unpack_blocks(raw: np.ndarray, name: str, in_features: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF rows ``raw`` uint8 [N, row_bytes] -> (u uint8 [N, K], d, m float32 [N, K/G])."""
    _, per_block, nbytes = FORMATS[name]
    n = raw.shape[0]
    blocks = raw.reshape(n * in_features // per_block, nbytes)
    if name == "Q8_0":
        d = _f16(blocks[:, 0:2])
        u = blocks[:, 2:] ^ np.uint8(0x80)  # int8 q -> q + 128
        m = -128.0 * d
    elif name in ("Q4_0", "Q4_1"):
        d = _f16(blocks[:, 0:2])
        off = 2 if name == "Q4_0" else 4
        m = -8.0 * d if name == "Q4_0" else _f16(blocks[:, 2:4])
        u = _nibbles16(blocks[:, off:off + 16])
    elif name in ("Q5_0", "Q5_1"):
        d = _f16(blocks[:, 0:2])
        off = 2 if name == "Q5_0" else 4
        m = -16.0 * d if name == "Q5_0" else _f16(blocks[:, 2:4])
        u = _nibbles16(blocks[:, off + 4:off + 20]) | _high_bits(blocks[:, off:off + 4])
    elif name == "Q6_K":  # ql [128], qh [64], 16 int8 scales, d; two halves of 128 weights
        ql = blocks[:, :128].reshape(-1, 2, 2, 32)  # [half, low / high 32 bytes, 32]
        qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
        lo = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [half, 4 quarters, 32]
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
        u = lo | (((qh >> shifts) & 3) << 4)
        sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
        d = (_f16(blocks[:, 208:210])[:, None] * sc).reshape(-1)
        m = -32.0 * d
    else:  # Q4_K, Q5_K: 8 sub-blocks of 32 per super-block
        dd = _f16(blocks[:, 0:2])[:, None]
        dmin = _f16(blocks[:, 2:4])[:, None]
        sc, mn = _k_scales(blocks[:, 4:16])
        d, m = (dd * sc).reshape(-1), (-dmin * mn).reshape(-1)
        qs = blocks[:, -128:].reshape(-1, 4, 32)  # chunk c: sub-blocks 2c (low), 2c+1 (high)
        u = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
        if name == "Q5_K":
            qh = blocks[:, 16:48]  # bit i of byte l: value l of sub-block i
            hb = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
            u = u | (hb << 4)
    u = np.ascontiguousarray(u, dtype=np.uint8).reshape(n, in_features)
    nb = in_features // group_size(name)
    return (u, np.asarray(d, np.float32).reshape(n, nb), np.asarray(m, np.float32).reshape(n, nb))


def pack_nibbles(u: torch.Tensor) -> torch.Tensor:
    """u uint8 [N, K] with values < 16 -> [N, K/2] in the kernels' nibble order. In numpy,
    writing into the output's own memory: torch's uint8 shifts and ors over these strided
    views took 24 ms a 1024 x 1024 weight against 0.3 ms (a 30B MoE model repacks 30B of
    them at load)."""
    n, k = u.shape
    src = u.cpu().numpy()
    full = k // 64 * 64
    out = np.empty((n, k // 2), dtype=np.uint8)
    main = src[:, :full].reshape(n, -1, 2, 32)
    dst = out[:, :full // 2].reshape(n, -1, 32)
    np.left_shift(main[:, :, 1], 4, out=dst)
    np.bitwise_or(dst, main[:, :, 0], out=dst)
    if k > full:
        tail = src[:, full:].reshape(n, 2, 16)
        out[:, full // 2:] = tail[:, 0] | (tail[:, 1] << 4)
    return torch.from_numpy(out).to(u.device)


def unpack_nibbles(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`."""
    n = packed.shape[0]
    full = in_features // 64 * 64
    main = packed[:, :full // 2].reshape(n, -1, 32)
    parts = [torch.stack([main & 0x0F, main >> 4], dim=2).reshape(n, -1)]
    if in_features > full:
        tail = packed[:, full // 2:]
        parts.append(torch.cat([tail & 0x0F, tail >> 4], dim=1))
    return torch.cat(parts, dim=1)


def _narrow_scales(d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float16 copies of d and m when both are exactly float16, else the float32 ones."""
    with np.errstate(over="ignore"):
        d16, m16 = d.astype(np.float16), m.astype(np.float16)
    if np.array_equal(d16.astype(np.float32), d) and np.array_equal(m16.astype(np.float32), m):
        return d16, m16
    return d, m


ROWS = 16  # weight rows per interleaved group


def can_interleave(out_features: int, in_features: int) -> bool:
    return out_features % ROWS == 0 and in_features % 64 == 0


def interleave(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-major (qweight [N, B], scales [N, G]) -> interleaved by 16 rows (module docstring)."""
    n, nbytes = qweight.shape
    # The byte shuffle in numpy: torch's uint8 permute-copy took 12 ms a 1024 x 512 weight
    # against 1 ms.
    qn = qweight.cpu().numpy().reshape(n // ROWS, ROWS, nbytes // 4, 4).transpose(0, 2, 1, 3)
    q = torch.from_numpy(np.ascontiguousarray(qn).reshape(n // ROWS, nbytes // 4, ROWS * 4))
    s, m = (t.view(n // ROWS, ROWS, -1).transpose(1, 2).contiguous() for t in (scales, mins))
    return q.to(qweight.device), s, m


def deinterleave(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`interleave`; row-major tensors are returned as they are."""
    if qweight.dim() == 2:
        return qweight, scales, mins
    groups, runs, _ = qweight.shape
    q = qweight.view(groups, runs, ROWS, 4).permute(0, 2, 1, 3).reshape(groups * ROWS, runs * 4)
    s, m = (t.transpose(1, 2).reshape(groups * ROWS, -1) for t in (scales, mins))
    return q, s, m


def out_features(qweight: torch.Tensor) -> int:
    return qweight.shape[0] * (ROWS if qweight.dim() == 3 else 1)


def repack(raw: torch.Tensor, name: str, in_features: int, interleaved: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF rows (uint8 [N, row_bytes]) -> (qweight, scales, mins) of the kernels' layout,
    interleaved by 16 rows when asked and the shape allows."""
    u, d, m = unpack_blocks(raw.cpu().numpy(), name, in_features)
    d, m = _narrow_scales(d, m)
    qweight = torch.from_numpy(u)
    if bits(name) == 4:
        qweight = pack_nibbles(qweight)
    out = (qweight, torch.from_numpy(d), torch.from_numpy(m))
    if interleaved and can_interleave(raw.shape[0], in_features):
        out = interleave(*out)
    dev = raw.device
    return tuple(t.to(dev) for t in out)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
               in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [N, K] of a repacked layer, row-major or interleaved (the reference
    every kernel is tested against)."""
    qweight, scales, mins = deinterleave(qweight, scales, mins)
    n = qweight.shape[0]
    u = qweight if qweight.shape[1] == in_features else unpack_nibbles(qweight, in_features)
    group = in_features // scales.shape[1]
    w = u.view(n, -1, group).float() * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1)
    return w.reshape(n, in_features).to(dtype)


def dequantize_rows(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                    ids: torch.Tensor, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (1-D) of the float weight: a token embedding's lookup."""
    if qweight.dim() == 3:  # the ids' 16-row groups, then their lanes
        lane = ids % ROWS
        q = qweight[ids // ROWS].view(len(ids), qweight.shape[1], ROWS, 4)
        q = q[torch.arange(len(ids)), :, lane].reshape(len(ids), -1)
        s, m = (t[ids // ROWS][torch.arange(len(ids)), :, lane] for t in (scales, mins))
        return dequantize(q, s, m, in_features, dtype)
    return dequantize(qweight[ids], scales[ids], mins[ids], in_features, dtype)
