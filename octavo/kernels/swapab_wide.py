"""4-bit weight-only GEMM for batches of 17 to a few hundred rows in CUDA C++
(``octavo/kernels/cuda/swapab_wide.cu``) over ``w4a16_swapab``'s packed layout, on the tensor
cores' ``mma.sync`` with the weights as the A operand.

Why: past 128 rows a 4-bit layer dequantized its whole weight to a bf16 temporary and called
cuBLAS (``w4a16_swapab.dequantize_swapab``): 4.5 bytes a weight through HBM against bf16's 2,
about twice a bf16 GEMM's time (H200, Llama-3.1-8B gate_up at 256 rows: 175.9 us against
88.9; W2 with W4A16 0.82x bf16, issue 12's target 0.9x). The Triton GEMMs tried for these
batches (docs/benchmarks.md sessions 13, 35) lost: Triton moved the dequantized tile through
shared memory on the warps that wait for the tensor cores. Here each lane dequantizes its
own A fragments in registers (one shift and LOP3 for bias + q, then (v - (bias + z)) * s in
the 16-bit type: exact difference, one rounding, the value the dequantization writes), the
activations [8 NT rows, 64 K] and the group's scales and zeros come through shared memory
with ``cp.async`` (3 stages; or 4 with the weights through it too, ``wsmem``), and each
fragment feeds 4 NT products. A CTA is 4 warps over
one 64-row block of the layout (256 output columns; 8 warps: two blocks sharing the
activations' tile) and 8 NT batch rows (NT 4 to 32 rows, 8 past them); K is split over CTAs
where the tiles do not fill the GPU, each warp finishing its own outputs by a ticket
(``octavo.kernels.split_k``'s counters).

Unmeasured on a GPU when written (session 52): the engine sends it nothing unless
``OCTAVO_SWAPAB_WIDE_MIN_M`` names the smallest batch to take (``int_weight_layout``).
"""

from __future__ import annotations

import dataclasses

import torch

from octavo import envs
from octavo.kernels import cuda_module, swapab_mma
from octavo.kernels import pdl as pdl_mod
from octavo.kernels.split_k import buffers as split_k_buffers
from octavo.kernels.split_k import counters as split_k_counters
from octavo.kernels.triton_utils import num_compute_units

SOURCE = "swapab_wide.cu"
BLOCK_COLUMNS = 256  # output columns of a 64-row block of int16 rows, 4 values each
CHUNK = 64  # K per pipeline stage
WARPS = 4  # per CTA by default: one block (8: two)
# (NT, warps, stages, the weights through shared memory too) built (cuda/swapab_wide.cu);
# registers (ptxas, sm_90, bf16): 189 / 254 / 174 / 255, then 163 / 246 / 244, no spills.
BUILT = frozenset({(4, 4, 3, False), (8, 4, 3, False), (4, 8, 3, False), (8, 8, 3, False),
                   (4, 4, 4, True), (8, 4, 4, True), (8, 8, 4, True)})
CTAS_PER_SM = 2  # the split's aim (254 registers x 128 threads: two CTAs fit an SM)
# The largest batch the engine sends here: past it (prefill chunks) a GEMM is bound by the
# tensor cores, where cuBLAS's wgmma outruns mma.sync by more than the dequantization costs
# (Llama-8B gate_up: ~60 us to dequantize against ~5 ms of GEMM at 16,384 rows).
ENGINE_MAX_M = 512
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def supports(m: int, k: int, n: int, group_size: int, bits: int, dtype: torch.dtype) -> bool:
    return (bits == 4 and m >= 1 and dtype in _DTYPES and n % BLOCK_COLUMNS == 0
            and group_size % CHUNK == 0 and k % group_size == 0)


def batch_tiles(m: int) -> int:
    """NT: 4 (32 rows a CTA) for batches of at most 32 rows, else 8 (64)."""
    return 4 if m <= 32 else 8


@dataclasses.dataclass(frozen=True)
class Plan:
    nt: int  # batch tiles of 8 rows per CTA
    warps: int  # per CTA: 16 int16 rows (64 output columns) each
    stages: int  # chunks in flight through shared memory
    wsmem: bool  # the weights through shared memory too (else a chunk ahead in registers)
    blocks: int  # CTAs along N
    row_tiles: int  # CTAs along M
    splits: int  # CTAs along K
    k_per_split: int

    def kernel(self, dtype: torch.dtype, scale_dtype: torch.dtype) -> str:
        return (f"swapab_wide_{_DTYPES[dtype]}_{_DTYPES[scale_dtype]}_m{self.nt}_w{self.warps}"
                f"_p{self.stages}" + ("_ws" if self.wsmem else ""))

    @property
    def shared_bytes(self) -> int:
        return self.stages * stage_bytes(self.nt, self.warps, self.wsmem)


def stage_bytes(nt: int, warps: int, wsmem: bool) -> int:
    """One stage's shared memory (cuda/swapab_wide.cu's stage_pieces, in bytes): activations
    [8 NT, 64], the CTA's scales and zeros of a group, (wsmem) each warp's two steps of
    weights."""
    return 16 * (8 * nt * CHUNK // 8 + 2 * (64 * warps // 8) + (warps * 128 if wsmem else 0))


def plan(m: int, k: int, n: int, sms: int, nt: int | None = None,
         ctas_per_sm: int = CTAS_PER_SM, splits: int | None = None,
         warps: int = WARPS, wsmem: bool = False) -> Plan:
    """Tiles of 64 ``warps`` columns x 8 NT rows; K split over CTAs (whole chunks, none
    empty) until the grid holds about ``ctas_per_sm`` CTAs per SM (or into ``splits``)."""
    nt = nt or batch_tiles(m)
    stages = 4 if wsmem else 3
    if (nt, warps, stages, wsmem) not in BUILT or n % (64 * warps):
        raise ValueError(f"swapab_wide: no kernel for {nt} batch tiles, {warps} warps"
                         f"{', weights staged' if wsmem else ''} at N={n} (built: "
                         f"{sorted(BUILT)}, N a multiple of 64 x warps)")
    blocks, row_tiles = n // (64 * warps), -(-m // (8 * nt))
    chunks = k // CHUNK
    want = splits or -(-ctas_per_sm * sms // (blocks * row_tiles))
    per = -(-chunks // max(1, min(want, chunks)))  # chunks per split
    return Plan(nt, warps, stages, wsmem, blocks, row_tiles, -(-chunks // per), per * CHUNK)


def engine_plan(m: int, n: int) -> dict:
    """The engine's launch arguments at ``m`` rows and ``n`` columns
    (``OCTAVO_SWAPAB_WIDE_PLAN``: warps, the weights through shared memory, CTAs per SM);
    4 warps where ``n`` does not fill 8 warps' tiles; NT from ``batch_tiles``, or 8 where
    that variant was not built."""
    warps, wsmem, ctas = envs.swapab_wide_plan()
    if n % (64 * warps):
        warps = 4
    nt = batch_tiles(m)
    if (nt, warps, 4 if wsmem else 3, wsmem) not in BUILT:
        nt = 8
    return {"nt": nt, "warps": warps, "wsmem": wsmem, "ctas_per_sm": ctas}


def available(device: torch.device) -> bool:
    """Built (nvcc, an NVIDIA GPU) and not turned off (``OCTAVO_CUDA_KERNELS=0``)."""
    return envs.cuda_kernels() and cuda_module.module(SOURCE, device) is not None


def swapab_wide(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor, group_size: int, bits: int = 4, nt: int | None = None,
                ctas_per_sm: int = CTAS_PER_SM, splits: int | None = None,
                warps: int = WARPS, wsmem: bool = False) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W) [K, N]`` for ``qweight`` in ``pack_swapab``'s 4-bit layout,
    scales and (float) zeros [K / group, N] in bf16 or fp16. The tuning arguments exist for
    the benchmarks."""
    m, k = x2.shape
    n = qweight.shape[0] * (16 // bits)
    if not supports(m, k, n, group_size, bits, x2.dtype):
        raise ValueError(f"swapab_wide: M={m}, K={k}, N={n}, group {group_size}, {bits}-bit, "
                         f"{x2.dtype} is not a supported shape")
    qweight, scales, zeros = swapab_mma.stored_operands(x2, qweight, scales, zeros)
    if scales.data_ptr() % 16 or zeros.data_ptr() % 16:  # copied in 16-byte pieces
        scales, zeros = scales.clone(), zeros.clone()
    x2 = cuda_module.aligned_rows(x2)
    mod = cuda_module.loaded(SOURCE, x2.device)
    p = plan(m, k, n, num_compute_units(x2.device), nt, ctas_per_sm, splits, warps, wsmem)
    out, partial = split_k_buffers(m, n, p.splits, x2)
    cnt = split_k_counters(x2.device, p.blocks * p.row_tiles * p.warps)
    args = cuda_module.arguments(x2, qweight, scales, zeros, out, partial, cnt, m, n, k,
                                 x2.stride(0), p.k_per_split, group_size)
    mod.launch(p.kernel(x2.dtype, scales.dtype), (p.blocks, p.row_tiles, p.splits), 32 * p.warps,
               args, pdl=pdl_mod.enabled(x2.device), shared_bytes=p.shared_bytes)
    return out
