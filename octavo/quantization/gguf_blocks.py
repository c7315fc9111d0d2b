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

Interleaved layers are stored tighter still (quant_gemm.h): the 5- and 6-bit formats (Q5_0,
Q5_1, Q5_K, Q6_K) as the nibbles plus their high bits, each 64-input chunk's 8 runs of nibbles
followed by the runs' h-bit fields packed in 2 h vectors of 64 bytes (``qweight [N/16,
(K/2 + h K/8)/4, 64]``); the formats whose m is -2^(bits-1) d (Q4_0, Q5_0, Q8_0, Q6_K) keep no
mins (an empty tensor); K-quants keep their integer scales under float16 super-block ones
(uint8 / int8 ``scales``). Each layer then reads about the file's own bytes a weight, as
llama.cpp does.

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
HIGH_PLANES = {"Q5_0": 1, "Q5_1": 1, "Q5_K": 1, "Q6_K": 2}  # interleaved: bits beyond a nibble
TWO_LEVEL = ("Q4_K", "Q5_K", "Q6_K")  # interleaved: integer scales and float16 super-blocks
SYMMETRIC = ("Q4_0", "Q5_0", "Q8_0", "Q6_K")  # m = -2^(bits-1) d: interleaved, no mins kept


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


def _k_integer_scales(raw: np.ndarray, name: str, in_features: int
                      ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """A K-quant's scales as the file holds them: integer scales [N, K/G] (uint8 6-bit for
    Q4_K / Q5_K, int8 for Q6_K), 6-bit mins [N, K/G] (None for Q6_K) and the float16
    super-block d and dmin [N, K/256] (dmin zero for Q6_K)."""
    _, per_block, nbytes = FORMATS[name]
    n = raw.shape[0]
    blocks = raw.reshape(n * in_features // per_block, nbytes)
    if name == "Q6_K":
        sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8)
        mn, dsup = None, np.ascontiguousarray(blocks[:, 208:210]).view(np.float16)
        dmin = np.zeros_like(dsup)
    else:
        sc, mn = (a.astype(np.uint8).reshape(n, -1) for a in _k_scales(blocks[:, 4:16]))
        dsup = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16)
        dmin = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16)
    return sc.reshape(n, -1), mn, dsup.reshape(n, -1), dmin.reshape(n, -1)


def _two_level_scales(sc: np.ndarray, dsup: np.ndarray, dmin: np.ndarray) -> torch.Tensor:
    """The interleaved two-level scales tensor [N/16, K/G + 4 K/256, 16] (quant_gemm.h), of
    the integer scales' dtype."""
    groups = sc.shape[0] // ROWS
    sub = _interleave_scales(torch.from_numpy(sc.view(np.uint8))).numpy()
    sup = [_interleave_scales(torch.from_numpy(a)).numpy().view(np.uint8).reshape(groups, -1, ROWS)
           for a in (dsup, dmin)]
    out = np.ascontiguousarray(np.concatenate([sub, *sup], axis=1))
    return torch.from_numpy(out.view(sc.dtype))


def _two_level_float(scales: torch.Tensor, mins: torch.Tensor, in_features: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major float32 d and m [N, K/G] of interleaved two-level scales."""
    groups, rows, _ = scales.shape
    nsup = in_features // 256
    ng = rows - 4 * nsup
    flat = lambda t: t.transpose(1, 2).reshape(groups * ROWS, -1)  # noqa: E731
    sub = flat(scales[:, :ng]).float()
    sup = scales[:, ng:].contiguous().view(torch.uint8).view(torch.float16)
    sup = sup.reshape(groups, 2 * nsup, ROWS)  # d_super, then dmin, per super-block
    dsup, dmin = (flat(sup[:, i * nsup:(i + 1) * nsup]).float().repeat_interleave(ng // nsup, 1)
                  for i in (0, 1))
    d = dsup * sub
    if mins.numel() == 0:  # Q6_K: m = -32 d
        return d, d * -32.0
    return d, -dmin * flat(mins).float()


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


def _narrow_scales(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """float16 copies of d (and m) when all are exactly float16, else the float32 ones."""
    with np.errstate(over="ignore"):
        narrow = tuple(a.astype(np.float16) for a in arrays)
    if all(np.array_equal(h.astype(np.float32), a) for h, a in zip(narrow, arrays, strict=True)):
        return narrow
    return arrays


ROWS = 16  # weight rows per interleaved group


def can_interleave(out_features: int, in_features: int) -> bool:
    return out_features % ROWS == 0 and in_features % 64 == 0


def interleave(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-major (qweight [N, B], scales [N, G]) -> interleaved by 16 rows (module docstring);
    an empty ``mins`` stays empty."""
    n, nbytes = qweight.shape
    # The byte shuffle in numpy: torch's uint8 permute-copy took 12 ms a 1024 x 512 weight
    # against 1 ms.
    qn = qweight.cpu().numpy().reshape(n // ROWS, ROWS, nbytes // 4, 4).transpose(0, 2, 1, 3)
    q = torch.from_numpy(np.ascontiguousarray(qn).reshape(n // ROWS, nbytes // 4, ROWS * 4))
    return q.to(qweight.device), _interleave_scales(scales), _interleave_scales(mins)


def _interleave_scales(t: torch.Tensor) -> torch.Tensor:
    """[N, G] -> [N/16, G, 16]; an empty tensor stays empty."""
    if t.numel() == 0:
        return t
    return t.view(t.shape[0] // ROWS, ROWS, -1).transpose(1, 2).contiguous()


def _interleave_high(u: np.ndarray, planes: int) -> torch.Tensor:
    """u uint8 [N, K] (values < 2^(4 + planes)) -> the interleaved nibbles-and-high-bits
    qweight [N/16, (K/2 + planes K/8)/4, 64] (layout: quant_gemm.h)."""
    n, k = u.shape
    groups, chunks, per = n // ROWS, k // 64, 4 // planes
    nib = interleave(pack_nibbles(torch.from_numpy(u & 0x0F)), torch.empty(0), torch.empty(0))[0]
    nib = nib.numpy().reshape(groups, chunks, 512)
    # high bits as [group, row r, chunk, which nibble, vector t, run in vector jj, byte b];
    # slot v = 2 jj + which lands at bit planes * v of its byte (strided views or-ed in place:
    # one 7-D transpose of the whole weight took 10 s of a 0.5B model's load)
    hb = (u >> 4).reshape(groups, ROWS, chunks, 2, 2 * planes, per, 4)
    acc = np.zeros((groups, ROWS, chunks, 2 * planes, 4), dtype=np.uint8)
    for jj in range(per):
        for which in range(2):
            acc |= hb[:, :, :, which, :, jj, :] << np.uint8(planes * (2 * jj + which))
    high = np.ascontiguousarray(acc.transpose(0, 2, 3, 1, 4)).reshape(groups, chunks,
                                                                       2 * planes * 64)
    q = np.concatenate([nib, high], axis=2).reshape(groups, -1, ROWS * 4)
    return torch.from_numpy(np.ascontiguousarray(q))


def stored_bits(qweight: torch.Tensor, in_features: int) -> int:
    """Bits a weight as stored: 4 or 8 (either layout), 5 or 6 (interleaved)."""
    rb = qweight.shape[1] * (4 if qweight.dim() == 3 else 1)
    for b in (4, 5, 6, 8):
        if rb * 8 == b * in_features:
            return b
    raise ValueError(f"qweight {tuple(qweight.shape)} does not hold {in_features} inputs a row")


def _lane_rows(qweight: torch.Tensor, groups: torch.Tensor, lanes: torch.Tensor,
               in_features: int) -> torch.Tensor:
    """Rows (group, lane) of an interleaved qweight in the row-major layout: packed nibbles
    for 4 bits, else a byte a weight."""
    bits_ = stored_bits(qweight, in_features)
    q = qweight[groups]
    n, ar = len(groups), torch.arange(len(groups))
    if bits_ in (4, 8):
        return q.view(n, q.shape[1], ROWS, 4)[ar, :, lanes].reshape(n, -1)
    planes, chunks = bits_ - 4, in_features // 64
    per = 4 // planes
    q = q.reshape(n, chunks, 512 + 128 * planes)
    nib = q[:, :, :512].reshape(n, chunks, 8, ROWS, 4)[ar, :, :, lanes]  # [n, chunk, j, b]
    hv = q[:, :, 512:].reshape(n, chunks, 2 * planes, ROWS, 4)[ar, :, :, lanes]  # [n, c, t, b]
    shifts = planes * torch.arange(2 * per).view(1, 1, 1, per, 2, 1)  # slot v = 2 jj + which
    high = (hv.to(torch.int32).view(n, chunks, 2 * planes, 1, 1, 4) >> shifts) & ((1 << planes) - 1)
    high = high.reshape(n, chunks, 8, 2, 4)  # [n, chunk, j = t per + jj, which, b]
    u = torch.stack([(nib & 0x0F) + (high[:, :, :, 0] << 4),
                     (nib >> 4) + (high[:, :, :, 1] << 4)], dim=2)
    return u.reshape(n, in_features).to(torch.uint8)


def _lane_scales(t: torch.Tensor, groups: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    return t[groups][torch.arange(len(groups)), :, lanes]


def _explicit_mins(scales: torch.Tensor, mins: torch.Tensor, bits_: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, mins) with a left-out mins made explicit: m = -2^(bits-1) d (float32 for
    both where that m is not exactly float16)."""
    if mins.numel():
        return scales, mins
    m = scales.float() * -float(1 << (bits_ - 1))
    if scales.dtype == torch.float16 and torch.equal(m.half().float(), m):
        return scales, m.half()
    return scales.float(), m


def _rows_scales(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                 groups: torch.Tensor, lanes: torch.Tensor, in_features: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit float d and m of rows (group, lane) of an interleaved layer."""
    if scales.dtype in (torch.uint8, torch.int8):  # the rows' own groups only
        d, m = _two_level_float(scales[groups], mins if mins.numel() == 0 else mins[groups],
                                in_features)
        rows = torch.arange(len(groups)) * ROWS + lanes
        return d[rows], m[rows]
    s = _lane_scales(scales, groups, lanes)
    m = mins if mins.numel() == 0 else _lane_scales(mins, groups, lanes)
    return _explicit_mins(s, m, stored_bits(qweight, in_features))


def deinterleave(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                 in_features: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of the interleaved layouts: row-major packed nibbles (4 bits) or a byte a
    weight (5, 6, 8), with explicit float mins; row-major tensors are returned as they are."""
    if qweight.dim() == 2:
        return qweight, scales, mins
    groups = torch.arange(qweight.shape[0]).repeat_interleave(ROWS)
    lanes = torch.arange(ROWS).repeat(qweight.shape[0])
    q = _lane_rows(qweight, groups, lanes, in_features)
    if scales.dtype in (torch.uint8, torch.int8):  # every row, in order
        return (q, *_two_level_float(scales, mins, in_features))
    return (q, *_rows_scales(qweight, scales, mins, groups, lanes, in_features))


def out_features(qweight: torch.Tensor) -> int:
    return qweight.shape[0] * (ROWS if qweight.dim() == 3 else 1)


def repack(raw: torch.Tensor, name: str, in_features: int, interleaved: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF rows (uint8 [N, row_bytes]) -> (qweight, scales, mins) of the kernels' layout,
    interleaved by 16 rows when asked and the shape allows."""
    return repack_parts([(raw, name)], in_features, interleaved)


def _store_bits(name: str, interleaved: bool) -> int:
    return 4 + HIGH_PLANES[name] if interleaved and name in HIGH_PLANES else bits(name)


def repack_parts(parts: list[tuple[torch.Tensor, str]], in_features: int,
                 interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows of several GGUF tensors, each in its own block format (a merged q/k/v whose v
    is Q8_0 and q, k Q5_0), stacked in order into one layer of the kernels' layout: the
    widest part's bits (a part's u fits any wider storage), per-16 scales when any part has
    them (a per-32 scale is two equal per-16 ones), mins kept unless every part is the same
    format whose m is -2^(bits-1) d. Exact: each row keeps its own d * u + m."""
    names = [name for _, name in parts]
    n = sum(raw.shape[0] for raw, _ in parts)
    dev = parts[0][0].device
    inter = interleaved and can_interleave(n, in_features)
    group = min(group_size(name) for name in names)
    store = max(_store_bits(name, inter) for name in names)
    if not inter:
        store = 4 if all(bits(name) == 4 for name in names) else 8
    one = names[0] if len(set(names)) == 1 else None
    two_level = inter and one in TWO_LEVEL
    us, ds, ms, ks = [], [], [], []
    for raw, name in parts:
        arr = raw.cpu().numpy()
        u, d, m = unpack_blocks(arr, name, in_features)
        us.append(u)
        if two_level:  # the file's integer scales instead of the float d and m
            ks.append(_k_integer_scales(arr, name, in_features))
        else:
            rep = group_size(name) // group  # a per-32 scale as two per-16 ones
            ds.append(np.repeat(d, rep, axis=1))
            ms.append(np.repeat(m, rep, axis=1))
    u = np.concatenate(us) if len(us) > 1 else us[0]
    if two_level:
        sc, mn, dsup, dmin = (None if a[0] is None else np.concatenate(a) for a in zip(*ks))
        scales = _two_level_scales(sc, dsup, dmin)
        mins = (torch.empty(0, dtype=torch.uint8) if mn is None
                else _interleave_scales(torch.from_numpy(mn)))
        if store in (5, 6):
            qweight = _interleave_high(u, store - 4)
        else:
            qweight = torch.from_numpy(u)
            qweight = interleave(pack_nibbles(qweight) if store == 4 else qweight,
                                 scales[:0], mins[:0])[0]
        return tuple(t.to(dev) for t in (qweight, scales, mins))
    d, m = (np.concatenate(a) if len(a) > 1 else a[0] for a in (ds, ms))
    if inter and one in SYMMETRIC:
        (d,) = _narrow_scales(d)
        m = np.empty(0, d.dtype)
    else:
        d, m = _narrow_scales(d, m)
    if store in (5, 6):
        out = (_interleave_high(u, store - 4), _interleave_scales(torch.from_numpy(d)),
               _interleave_scales(torch.from_numpy(m)))
    else:
        qweight = torch.from_numpy(u)
        if store == 4:
            qweight = pack_nibbles(qweight)
        out = (qweight, torch.from_numpy(d), torch.from_numpy(m))
        if inter:
            out = interleave(*out)
    return tuple(t.to(dev) for t in out)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
               in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [N, K] of a repacked layer, row-major or interleaved (the reference
    every kernel is tested against)."""
    qweight, scales, mins = deinterleave(qweight, scales, mins, in_features)
    n = qweight.shape[0]
    u = qweight if qweight.shape[1] == in_features else unpack_nibbles(qweight, in_features)
    group = in_features // scales.shape[1]
    w = u.view(n, -1, group).float() * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1)
    return w.reshape(n, in_features).to(dtype)


def dequantize_rows(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                    ids: torch.Tensor, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (1-D) of the float weight: a token embedding's lookup."""
    if qweight.dim() == 3:  # the ids' 16-row groups, then their lanes
        groups, lanes = ids // ROWS, ids % ROWS
        q = _lane_rows(qweight, groups, lanes, in_features)
        s, m = _rows_scales(qweight, scales, mins, groups, lanes, in_features)
        return dequantize(q, s, m, in_features, dtype)
    return dequantize(qweight[ids], scales[ids], mins[ids], in_features, dtype)
