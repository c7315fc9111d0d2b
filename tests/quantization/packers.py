"""Test-only quantizers that write GPTQ and AWQ tensors from their public definitions, written
independently of Octavo's unpacking so that each checks the other.

GPTQ (AutoGPTQ / GPTQModel): qweight int32 [in / pack, out], input row i of column o at bits
``(i % pack) * bits`` of ``qweight[i // pack, o]``; qzeros int32 [groups, out / pack] packed
the same way along the output (v1 "gptq" stores zero - 1, v2 the zero); scales [groups, out];
g_idx [in].

AWQ (AutoAWQ ``WQLinear_GEMM.from_linear``): qweight int32 [in, out / 8], bits ``4j .. 4j+3``
of ``qweight[i, c]`` hold output column ``8c + ORDER[j]``, ORDER = 0, 2, 4, 6, 1, 3, 5, 7;
qzeros [groups, out / 8] the same; scales [groups, out].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


@dataclass
class Quantized:
    q: torch.Tensor  # int64 [in, out], 0 <= q < 2**bits
    zeros: torch.Tensor  # int64 [groups, out]
    scales: torch.Tensor  # float16 [groups, out]
    g_idx: torch.Tensor  # int64 [in]: the group of each input row

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] these integers stand for."""
        s = self.scales.float()[self.g_idx]
        z = self.zeros.float()[self.g_idx]
        return ((self.q.float() - z) * s).t().contiguous()


def quantize(w: torch.Tensor, bits: int, group_size: int, sym: bool,
             act_order: bool = False, seed: int = 0) -> Quantized:
    """Round-to-nearest group quantization of ``w`` [out, in] (GPTQ's grid without its error
    feedback: the format is what is under test). ``act_order``: groups are formed over a
    random permutation of the input rows, as GPTQ's desc_act does (by Hessian order)."""
    out_f, in_f = w.shape
    group = in_f if group_size == -1 else group_size
    maxq = 2**bits - 1
    order = torch.arange(in_f)
    if act_order:
        order = torch.randperm(in_f, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(in_f, dtype=torch.int64)
    g_idx[order] = torch.arange(in_f) // group  # row order[j] is the j-th quantized
    groups = in_f // group
    wt = w.t().float()  # [in, out]
    scales = torch.empty(groups, out_f)
    zeros = torch.empty(groups, out_f, dtype=torch.int64)
    for g in range(groups):
        rows = wt[g_idx == g]
        lo = rows.amin(0).clamp(max=0)
        hi = rows.amax(0).clamp(min=0)
        if sym:
            scale = torch.maximum(-lo, hi).clamp(min=1e-6) * 2 / maxq
            zero = torch.full((out_f,), (maxq + 1) // 2, dtype=torch.int64)
        else:
            scale = (hi - lo).clamp(min=1e-6) / maxq
            zero = torch.round(-lo / scale).to(torch.int64).clamp(0, maxq)
        scales[g], zeros[g] = scale, zero
    scales = scales.half()
    # Round with the float16 scales the checkpoint keeps, so dequantize() is what loads.
    s = scales.float()[g_idx]
    q = (torch.round(wt / s) + zeros[g_idx]).clamp(0, maxq).to(torch.int64)
    return Quantized(q, zeros, scales, g_idx)


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    """uint32 bit patterns held in int64 -> int32 with the same bits."""
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, cols] -> int32 [rows / pack, cols]: row r at bits (r % pack) * bits."""
    pack = 32 // bits
    out = torch.zeros(values.shape[0] // pack, values.shape[1], dtype=torch.int64)
    for r in range(values.shape[0]):
        out[r // pack] |= (values[r] & (2**bits - 1)) << ((r % pack) * bits)
    return _to_int32(out)


def pack_cols(values: torch.Tensor, bits: int, order: list[int] | None = None) -> torch.Tensor:
    """[rows, cols] -> int32 [rows, cols / pack]: slot j of entry c holds column
    ``c * pack + order[j]`` (natural order if None) at bits j * bits."""
    pack = 32 // bits
    order = order or list(range(pack))
    out = torch.zeros(values.shape[0], values.shape[1] // pack, dtype=torch.int64)
    for c in range(out.shape[1]):
        for j in range(pack):
            out[:, c] |= (values[:, c * pack + order[j]] & (2**bits - 1)) << (j * bits)
    return _to_int32(out)


def gptq_tensors(qz: Quantized, bits: int, checkpoint_format: str = "gptq"
                 ) -> dict[str, torch.Tensor]:
    """The tensors of one GPTQ layer (names without the module prefix)."""
    zeros = qz.zeros - 1 if checkpoint_format == "gptq" else qz.zeros
    # v1 stores zero - 1; masking in pack_cols keeps a -1 inside its own slot.
    return {"qweight": pack_rows(qz.q, bits), "qzeros": pack_cols(zeros, bits),
            "scales": qz.scales, "g_idx": qz.g_idx.to(torch.int32)}


def awq_tensors(qz: Quantized) -> dict[str, torch.Tensor]:
    """The tensors of one AWQ GEMM layer (names without the module prefix)."""
    return {"qweight": pack_cols(qz.q, 4, AWQ_PACK_ORDER),
            "qzeros": pack_cols(qz.zeros, 4, AWQ_PACK_ORDER), "scales": qz.scales}
