"""bitsandbytes' weight formats and their numerics, from the formats' definitions.

- 8-bit (LLM.int8 weights, ``Linear8bitLt``): ``weight`` int8 [out, in] and ``SCB`` float32
  [out], the absolute maximum of each output row: ``q = round(w * (127 / SCB))``,
  ``w = q * SCB * (1 / 127)``.
- 4-bit (``Linear4bit``, NF4 or FP4): the weight flattened row-major, cut into blocks of
  ``blocksize`` (64) values; each block scaled by its absolute maximum (``absmax``) into
  [-1, 1] and each value replaced by the index of the nearest entry of a 16-entry code
  (``quant_map``); two indices per byte, the first in the high nibble (``weight`` uint8
  [numel / 2, 1]). ``w = code[index] * absmax[block]``, computed in float32.
- Double quantization (``bnb_4bit_use_double_quant``): the float32 absmax minus its mean
  (``nested_offset``) quantized again in blocks of 256 with the 8-bit "dynamic" code
  (``nested_quant_map``, ``nested_absmax``); ``absmax`` is then uint8.
- The non-tensor fields (quant_type, blocksize, dtype, shape, nested_blocksize, nested_offset)
  travel as JSON bytes in a uint8 tensor ``weight.quant_state.bitsandbytes__<quant_type>``.
"""

from __future__ import annotations

import json

import torch

# NF4: quantiles of N(0, 1) normalized to [-1, 1] with an exact zero (QLoRA, Dettmers et al.
# 2023); the float32 values bitsandbytes uses.
NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
# FP4 (1 sign bit, then bitsandbytes' order of its 8 magnitudes, normalized so the largest is 1).
_FP4_MAGNITUDES = (0.0, 1 / 192, 2 / 3, 1.0, 1 / 3, 1 / 2, 1 / 6, 1 / 4)
FP4_CODE = _FP4_MAGNITUDES + tuple(-m for m in _FP4_MAGNITUDES)
INV_127 = 7.874015718698502e-3  # float32 1/127, multiplied as bitsandbytes does
NESTED_BLOCKSIZE = 256


def code_table(quant_type: str, device=None) -> torch.Tensor:
    if quant_type not in ("nf4", "fp4"):
        raise ValueError(f"bitsandbytes 4-bit quant_type={quant_type!r} is not supported "
                         "(supported: 'nf4', 'fp4')")
    return torch.tensor(NF4_CODE if quant_type == "nf4" else FP4_CODE, dtype=torch.float32,
                        device=device)


def dynamic_map(device=None) -> torch.Tensor:
    """The signed 8-bit dynamic code (Dettmers 2015): for exponents 10**-6 .. 10**0, the
    midpoints of ``2**i + 1`` linear steps over [0.1, 1], both signs, then 0 and 1; sorted."""
    data: list[float] = []
    for i in range(7):
        bounds = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    return torch.tensor(sorted(data), dtype=torch.float32, device=device)


def _nearest(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the nearest code entry (ties to the lower entry) of each value in [-1, 1]."""
    order = torch.argsort(code)
    sorted_code = code[order]
    bounds = (sorted_code[:-1] + sorted_code[1:]) / 2
    return order[torch.bucketize(scaled, bounds)]


def _block_scale(flat: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values scaled into [-1, 1] by their block's absmax, absmax per block) in float32."""
    n = flat.numel()
    blocks = -(-n // blocksize)
    padded = torch.nn.functional.pad(flat.float(), (0, blocks * blocksize - n))
    view = padded.view(blocks, blocksize)
    absmax = view.abs().amax(dim=1)
    scaled = torch.clamp(view * (1.0 / absmax.clamp(min=1e-38))[:, None], -1, 1)
    return scaled.reshape(-1)[:n], absmax


def quantize_blockwise(x: torch.Tensor, code: torch.Tensor,
                       blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 indices shaped like ``x``, float32 absmax per block of the flattened ``x``)."""
    scaled, absmax = _block_scale(x.reshape(-1), blocksize)
    return _nearest(scaled, code).to(torch.uint8).view(x.shape), absmax


def dequantize_blockwise(q: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                         blocksize: int) -> torch.Tensor:
    flat = code.float()[q.reshape(-1).long()]
    n = flat.numel()
    scale = absmax.float().reshape(-1).repeat_interleave(blocksize)[:n]
    return (flat * scale).view(q.shape)


def pack_nibbles(idx: torch.Tensor) -> torch.Tensor:
    """4-bit indices (flat, even count) -> uint8 [n / 2, 1], the first of each pair high."""
    idx = idx.reshape(-1).to(torch.uint8)
    return ((idx[0::2] << 4) | idx[1::2]).unsqueeze(1)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 bytes (any shape) -> the 4-bit indices, high nibble first, as a flat uint8."""
    flat = packed.reshape(-1)
    return torch.stack((flat >> 4, flat & 0xF), dim=1).reshape(-1)


def quantize_4bit(w: torch.Tensor, quant_type: str,
                  blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [numel / 2, 1], float32 absmax per block) of ``w`` flattened."""
    if w.numel() % 2:
        raise ValueError(f"4-bit packing needs an even number of values, got {w.numel()}")
    scaled, absmax = _block_scale(w.reshape(-1), blocksize)
    return pack_nibbles(_nearest(scaled, code_table(quant_type, w.device))), absmax


def dequantize_4bit(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                    blocksize: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 weight of ``shape``."""
    n = 1
    for s in shape:
        n *= s
    idx = unpack_nibbles(packed)[:n]
    return dequantize_blockwise(idx, absmax, code, blocksize).view(shape)


def double_quantize(absmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(uint8 absmax, nested_absmax, nested_offset): the float32 absmax minus its mean,
    quantized with the dynamic code in blocks of 256."""
    offset = absmax.mean()
    q, nested_absmax = quantize_blockwise(absmax - offset, dynamic_map(absmax.device),
                                          NESTED_BLOCKSIZE)
    return q, nested_absmax, offset.item()


def undo_double_quant(q: torch.Tensor, nested_absmax: torch.Tensor, nested_code: torch.Tensor,
                      nested_blocksize: int, offset: float) -> torch.Tensor:
    """The float32 absmax that a double-quantized checkpoint's uint8 absmax stands for."""
    return dequantize_blockwise(q, nested_absmax, nested_code, nested_blocksize) + offset


def quantize_int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], SCB float32 [out]): LLM.int8's per-output-row absmax quantization."""
    scb = w.abs().amax(dim=1).float()
    q = torch.round(w.float() * (127.0 / scb.clamp(min=1e-38))[:, None])
    return q.clamp(-127, 127).to(torch.int8), scb


def dequantize_int8_rows(q: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
    return q.float() * scb.float()[:, None] * INV_127


def parse_quant_state(packed: torch.Tensor) -> dict:
    """The JSON fields of a ``quant_state.bitsandbytes__<type>`` tensor."""
    return json.loads(bytes(packed.reshape(-1).cpu().tolist()).decode("utf-8"))
