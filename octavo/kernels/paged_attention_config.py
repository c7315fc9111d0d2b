"""Launch configuration of :mod:`octavo.kernels.paged_attention`: tile shapes and split-K
counts, decided on the host from shapes alone (so CUDA graphs can freeze them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.kernels.triton_utils import next_power_of_2, num_compute_units


@dataclass(frozen=True)
class _Config:
    block_q: int  # query tokens per program
    block_m: int  # rows per program: block_q * group, rounded up to a power of two >= 16
    block_n: int  # keys per inner iteration
    num_warps: int
    num_stages: int


# Split-K: each split covers at least this many keys, so the merge stays cheap.
_MIN_SPLIT_TOKENS = 256
_MAX_SPLITS = 64
# Keys per step of a split decode launch (one to ~16 requests: fewer (request, KV head)
# programs than SMs). On an H200 (docs/benchmarks.md session 31, alternated pairs) 64 against
# 128: Llama-3.1-8B batch 1 bf16 4.101 / 4.100 against 4.119 / 4.117 ms, fp8 2.597 / 2.596
# against 2.611 / 2.611; Qwen3-0.6B batch 4 0.921 / 0.885 against 0.968 / 0.965, batch 16
# 1.266 / 1.249 against 1.289 / 1.285; batch 1 within its noise (0.862 / 0.885 against
# 0.856 / 0.857 in one call, 1.019 / 0.989 against 1.041 / 1.057 in another); 32 keys lost
# (fp8 batch 1 2.652). Stream-K keeps 128 (session 14: 64 lost at batch 32).
_SPLIT_DECODE_BLOCK_N = 64
# Prefill chunks over a long cached context (chunked prefill of a long prompt): a 512-token
# chunk is only ~100 query tiles, each walking the whole context. Split their KV range too.
_MIN_PREFILL_SPLIT_TOKENS = 1024
# Query-tile rows of a split prefill launch (0: keep the unsplit tile).
_SPLIT_PREFILL_ROWS = 128


def with_tile(cfg: _Config, tile: tuple[int, int, int] | None) -> _Config:
    """``cfg`` with a measurement's (BLOCK_N, WARPS, STAGES) override, its rows kept; None:
    ``cfg`` as it is."""
    return cfg if tile is None else _Config(cfg.block_q, cfg.block_m, *tile)


def _rows(rows: int, group: int) -> tuple[int, int]:
    """(query tokens, rows) of a tile of about ``rows`` rows for a GQA group of ``group``."""
    block_q = max(1, rows // group)
    return block_q, max(16, next_power_of_2(block_q * group))


def _pick_config(
    decode: bool, group: int, head_dim_p: int, elem_bytes: int, on_gpu: bool,
    split: bool = False,
) -> _Config:
    """``split``: a decode launch that cuts each context into parts (small grids)."""
    # GPU choices were measured on an H200 (bf16, block_size 16) with
    # tests/kernels/bench_attention.py; fp32 and head_dim > 128 halve KV tiles to fit smem.
    if not on_gpu:
        # Interpreter (CPU tests): small tiles so tiny contexts still span several KV tiles.
        return _Config(*_rows(1 if decode else 32, group), 16, 1, 1)
    if decode:
        # Memory bound: one query per program, the GQA group fills the MMA rows; long KV
        # tiles keep many loads in flight. A split launch's parts are at least one tile, so
        # its tile is at most _SPLIT_DECODE_BLOCK_N keys: more, shorter parts.
        row_bytes = head_dim_p * elem_bytes
        block_n = 128 if row_bytes <= 256 else (64 if row_bytes <= 512 else 32)
        if split:
            block_n = min(block_n, _SPLIT_DECODE_BLOCK_N)
        return _Config(*_rows(1, group), block_n, 4, 2)
    if head_dim_p <= 64:
        return _Config(*_rows(64, group), 64, 4, 3)
    if head_dim_p <= 128:
        block_q, block_m = _rows(128, group)  # block_m >= 128 for every group
        if elem_bytes <= 2:
            # 32-key steps, 4 warps, 3 stages. H200, causal TFLOP/s against the 64-key /
            # 8-warp / 2-stage tile kept for float32 (session 36, call 3,
            # docs/results/h200_s36/call3_probe_prefill.json): 16 prompts x 1,000 tokens,
            # 16 / 8 heads 223 vs 188; 24 prompts of 100-1,024 186 vs 157; 32 / 8 heads 249
            # vs 223 at 16 x 1,000, 326 vs 328 at 4 x 4,096.
            return _Config(block_q, block_m, 32, 4, 3)
        return _Config(block_q, block_m, 64, 8, 2)
    return _Config(*_rows(64, group), 32, 4, 2)


def _pick_num_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """Split the KV range when the grid alone cannot give every SM a program and contexts
    may be long; then aim for about two programs per SM. A grid of one to two programs per
    SM is left whole: on an H200 (tests/kernels/bench_attention.py --short) batch 32 x 8 KV
    heads at W4's contexts took 12.6 us unsplit and 18.1 us in two splits plus their merge,
    and W1's batch 128 lost 4% to two splits (--w1)."""
    if max_seq_len < 2 * _MIN_SPLIT_TOKENS:
        return 1
    units = num_compute_units(device)
    target = 2 * units
    if num_programs >= units:
        return 1
    splits = min(-(-target // num_programs), max_seq_len // _MIN_SPLIT_TOKENS, _MAX_SPLITS)
    return max(1, splits)


def _merge_in_launch(num_programs: int, device: torch.device) -> bool:
    """Whether a split decode launch of ``num_programs`` (request, KV head) pairs merges its
    splits itself, in parts of at least _MIN_SPLIT_TOKENS keys, rather than in many short
    parts merged by a second launch. On an H200 (``benchmarks/latency.py``, Qwen3-0.6B shape,
    contexts 128-384, four calls) batch 8 and 16 (64 and 128 pairs) took 1.314-1.328 /
    1.456-1.466 ms per token merged in the launch against 1.374-1.385 / 1.502-1.532 with the
    second launch; batch 1 and 2 (8 and 16 pairs) lost 5-10%: there the short parts' extra
    parallelism pays for the second launch."""
    return num_programs >= max(1, num_compute_units(device) // 4)


def _pick_prefill_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """Splits for the prefill launch: about two programs per SM, rounded down so no partial
    wave trails (on the H200, 87 tiles x 3 splits = 261 programs took 62 us over an 8k
    context; x 4 = 348 took 87 us)."""
    if max_seq_len < 2 * _MIN_PREFILL_SPLIT_TOKENS:
        return 1
    splits = min(2 * num_compute_units(device) // num_programs,
                 max_seq_len // _MIN_PREFILL_SPLIT_TOKENS, _MAX_SPLITS)
    return max(1, splits)
