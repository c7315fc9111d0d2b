"""One merged part (q, k, v; gate, up; or a whole layer) of a bitsandbytes weight, decoded from
the checkpoint's tensors or quantized from a float weight, in a form that can be narrowed to
this rank's rows and columns and concatenated with the other parts.

- ``Int8Rows``: int8 [rows, cols] and SCB float32 [rows].
- ``Blocks4bit``: packed uint8 [rows, cols / 2] (two indices a byte, high nibble first) and the
  float32 absmax [rows, cols / blocksize] (double quantization undone), its code [16]. Needs
  ``cols`` divisible by the block size, so that no block straddles two rows.
- ``Dense``: a float32 [rows, cols], for what does not fit the two above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.quantization import bnb_format as fmt


@dataclass
class Dense:
    w: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    def narrow(self, r0: int, rows: int, c0: int, cols: int) -> Dense:
        return Dense(self.w[r0:r0 + rows, c0:c0 + cols])

    def dense(self) -> torch.Tensor:
        return self.w


@dataclass
class Int8Rows:
    q: torch.Tensor
    scb: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def narrow(self, r0: int, rows: int, c0: int, cols: int) -> Int8Rows:
        return Int8Rows(self.q[r0:r0 + rows, c0:c0 + cols], self.scb[r0:r0 + rows])

    def dense(self) -> torch.Tensor:
        return fmt.dequantize_int8_rows(self.q, self.scb)


@dataclass
class Blocks4bit:
    packed: torch.Tensor
    absmax: torch.Tensor
    code: torch.Tensor
    blocksize: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    def narrow(self, r0: int, rows: int, c0: int, cols: int) -> Blocks4bit | Dense:
        bs = self.blocksize
        if c0 % bs or cols % bs:
            return self.to_dense().narrow(r0, rows, c0, cols)
        return Blocks4bit(self.packed[r0:r0 + rows, c0 // 2:(c0 + cols) // 2],
                          self.absmax[r0:r0 + rows, c0 // bs:(c0 + cols) // bs],
                          self.code, bs)

    def dense(self) -> torch.Tensor:
        return dequantize_packed(self.packed, self.absmax, self.code, self.blocksize,
                                 torch.float32)

    def to_dense(self) -> Dense:
        return Dense(self.dense())


def byte_table(code: torch.Tensor) -> torch.Tensor:
    """[256, 2] float32: the two code values each packed byte stands for (high nibble first),
    so that dequantizing is one gather per byte instead of an unpack and two lookups."""
    b = torch.arange(256, device=code.device)
    return torch.stack((code.float()[b >> 4], code.float()[b & 0xF]), dim=1)


def dequantize_packed(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                      blocksize: int, dtype: torch.dtype,
                      table: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, cols/2] packed, [rows, cols/blocksize] absmax -> the [rows, cols] weight
    (float32 products, as bitsandbytes computes them, rounded once to ``dtype``).
    ``table``: ``byte_table(code)``, precomputed by callers that dequantize often."""
    rows = packed.shape[0]
    if table is None:
        table = byte_table(code)
    pairs = torch.nn.functional.embedding(packed.to(torch.int32), table)  # [rows, cols/2, 2]
    w = pairs.view(rows, -1, blocksize) * absmax.unsqueeze(-1)
    return w.view(rows, -1).to(dtype)


def blocks_or_dense(packed_flat: torch.Tensor, absmax_flat: torch.Tensor, code: torch.Tensor,
                    blocksize: int, rows: int, cols: int) -> Blocks4bit | Dense:
    """A flat bitsandbytes 4-bit weight as ``Blocks4bit`` when its blocks stay within rows."""
    if cols % blocksize == 0 and cols % 2 == 0:
        return Blocks4bit(packed_flat.reshape(rows, cols // 2),
                          absmax_flat.float().reshape(rows, cols // blocksize), code.float(),
                          blocksize)
    return Dense(fmt.dequantize_4bit(packed_flat, absmax_flat, code, blocksize, (rows, cols)))


def concat(parts: list) -> Int8Rows | Blocks4bit | Dense:
    """The parts stacked along rows; Dense unless they share a kind (and 4-bit code)."""
    if len(parts) == 1:
        return parts[0]
    kinds = {type(p) for p in parts}
    if kinds == {Int8Rows}:
        return Int8Rows(torch.cat([p.q for p in parts]), torch.cat([p.scb for p in parts]))
    if kinds == {Blocks4bit} and len({p.blocksize for p in parts}) == 1 and \
            all(torch.equal(p.code, parts[0].code) for p in parts):
        return Blocks4bit(torch.cat([p.packed for p in parts]),
                          torch.cat([p.absmax for p in parts]), parts[0].code,
                          parts[0].blocksize)
    return Dense(torch.cat([p.dense() for p in parts]))
