"""8-bit integer weights (W8A16: GPTQ, AWQ-style and compressed-tensors 8-bit, a scale and a
zero point per group of K) times bf16/fp16 activations for decode batches (M = 1..2): the FP8
GEMV's kernel (``octavo.kernels.fp8_gemv``, its U8 mode) on the weight in rows.

The layout (``rows``): uint8 [N, K], output feature n's weights contiguous along K, as the
float8 weights are; float ``scales`` [K / group, N]; the zero points either a float tensor of
that shape (exact integers) or one number for every group (symmetric checkpoints: 128).
``W[k, n] = (q[n, k] - z) * s``. Viewed as int32 words [N, K / 4] and transposed, the same
bytes are ``octavo.kernels.w4a16_gemm``'s 8-bit packing along K (byte i of word j is row
4j + i), so its dequantizer reads this layer's weight through strides (``as_along_k``) for
dequantize-then-cuBLAS, and ``octavo.kernels.int8_rows_gemm`` runs 3-128 rows: one copy of
the weight serves every batch size.

Why this kernel for one row: the along-K 8-bit GEMV reads [K / 4, N] words across N and sat
at 65-73% of HBM with a 10 us floor on Llama-8B's qkv / o (docs/benchmarks.md, session 22);
the FP8 GEMV reads the same byte count along K at 71-81%, and brings its fused stores (the
MLP's gate/up activation, the qkv projection's rotary and KV-cache write). What it gave on an
H200 (session 33, ``benchmarks/int8_gemv.py``, us from HBM, qkv / o / gate_up / down): one
group per row, on the FP8 GEMV's own K steps, 10.5 / 7.2 / 35.8 / 17.7 against the along-K
GEMV's 11.4 / 9.7 / 35.5 / 21.5 and the FP8 GEMV's 7.8 / 5.7 / 32.2 / 16.7. At g128 a K
step may not cross a group; 128-wide steps at one program per SM left the SMs unevenly loaded
(11.3 / 12.0 / 37.6 / 26.4), at about four per SM (``_plan``, session 34) they read qkv / o /
down in 10.1 / 7.4 / 19.9 against the along-K GEMV's 11.4 / 9.6 / 21.2 (gate/up 41.7 against
35.2); in the engine that tied the along-K layout at batch 1 and lost at 64 and 256
(``octavo.kernels.int_weight_layout``). So only layers whose groups allow the full steps
take the rows layout by default (``runs_full_steps``). Per 4 weights: 4
PRMTs place each byte in 1.0f's mantissa (1 + q 2**-15, exact, as the along-K 8-bit GEMV
does), 4 FMAs with the activations, and per word one FMA with the group's scale and one for
the zero and the 1.0 offsets (``fp8_gemv._word_dot``); for float32 activations each byte goes
to 2**23 + q and one subtraction more per weight makes q - z exact (the offsets' sums keep
~2**-16 of the result, under a 16-bit output's rounding but not float32's).
"""

from __future__ import annotations

import torch

from octavo.kernels import fp8_gemv as _gemv

MAX_M = _gemv.MAX_M
SMALLEST_STEP = _gemv.SMALLEST_STEP


def supports(m: int, k: int, group_size: int) -> bool:
    """Whether ``int8_gemv`` takes an [m, k] batch on a weight in groups of ``group_size``
    (K for one group per row)."""
    return 1 <= m <= MAX_M and k % 4 == 0 and k % group_size == 0 \
        and group_size % SMALLEST_STEP == 0


def runs_full_steps(n: int, k: int, group_size: int) -> bool:
    """Whether the GEMV runs an [N, K] weight in groups of ``group_size`` on the FP8 GEMV's
    own K steps (the group a multiple of them: one group per row, or long groups)."""
    return supports(1, k, group_size) and (group_size == k
                                           or group_size % _gemv._plan(n, k)[1] == 0)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """Integer values [K, N] (0 <= q < 256) -> the ``rows`` layout, uint8 [N, K]."""
    if q.shape[0] % 4:
        raise ValueError(f"K={q.shape[0]} is not divisible by 4 (one int32 word = 4 weights)")
    return q.t().to(torch.uint8).contiguous()


def as_along_k(weight: torch.Tensor) -> torch.Tensor:
    """The ``rows`` weight uint8 [N, K] as ``w4a16_gemm``'s 8-bit int32 [K / 4, N] (a view:
    strides (1, K / 4))."""
    return weight.view(torch.int32).t()


def _tuned(n: int, k: int, group: int, tuning: dict, x2: torch.Tensor) -> dict:
    block_n, block_k, warps, waves, stages = _gemv.group_plan(n, k, group)
    exact = tuning.get("exact")
    return {"exact": x2.dtype == torch.float32 if exact is None else exact,
            "split_k": tuning.get("split_k"), "block_n": tuning.get("block_n") or block_n,
            "block_k": tuning.get("block_k") or block_k,
            "num_warps": tuning.get("num_warps") or warps,
            "waves": tuning.get("waves") or waves, "stages": tuning.get("stages") or stages}


def int8_gemv(x2: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
              zeros: torch.Tensor | float, group_size: int, glu: bool = False,
              **tuning) -> torch.Tensor:
    """``x2 [M, K] @ dequant(W)`` -> [M, N] in x2's dtype, for M <= MAX_M; ``weight`` uint8
    [N, K] (``pack_rows``). ``glu``: the weight is an MLP's [gate | up] and the result
    ``silu(gate) * up`` [M, N / 2]. ``tuning``: split_k, block_n, block_k, num_warps, waves,
    stages, exact, tiled (None: chosen here), for the benchmark's sweeps; ``tiled``: the
    (block_n, block_k) that ``fp8_tiled.tile_fp8_weight`` tiled the bytes with (an experiment
    in how 128-wide K steps stream, as for the FP8 GEMV); ``exact``: each q - z
    exact before its product (the default for float32 activations), else the sums run on
    1 + q 2**-15 (one correction per 4 weights; ~2**-16 of the result)."""
    n, k = _gemv._weight_rows(weight), x2.shape[1]
    tiled = tuning.get("tiled")
    if tiled is not None:
        tuning = {**tuning, "block_n": tiled[0], "block_k": tiled[1]}
    t = _tuned(n, k, group_size, tuning, x2)
    return _gemv._launch(x2, weight, scales, t["split_k"], t["block_n"], t["block_k"],
                         t["num_warps"], t["waves"], False, None, t["stages"], glu=glu,
                         tiled=tiled, u8=(zeros, group_size, t["exact"]))


def int8_gemv_qkv_rope(x2: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                       zeros: torch.Tensor | float, group_size: int, positions: torch.Tensor,
                       cos_sin_cache: torch.Tensor, num_heads: int, num_kv_heads: int,
                       head_dim: int, kv_store, **tuning) -> torch.Tensor | None:
    """A qkv projection's one-split GEMV whose store rotates q and k and writes k and v into
    the paged cache, as ``fp8_gemv.fp8_gemv_qkv_rope`` does for float8 weights (the same
    conditions, ``fp8_gemv.qkv_rope_supported``) on the FP8 GEMV's own K steps
    (``runs_full_steps``); None, with nothing done, where it cannot. Groups shorter than those
    steps leave the rotary to its own launch: the store cannot split K, and 128-wide steps
    without a split cost Llama-3.1-8B W8A16 g128 at batch 1 3.504 ms a token against 3.132
    with the rotary launch (session 34, 16-row tiles for enough programs)."""
    n, k = weight.shape
    if not (runs_full_steps(n, k, group_size) and _gemv.qkv_rope_supported(
            x2, weight, positions, cos_sin_cache, num_heads, num_kv_heads, head_dim,
            kv_store)):
        return None
    t = _tuned(n, k, group_size, tuning, x2)
    kc, vc = kv_store.key_cache, kv_store.value_cache
    rope = (positions, cos_sin_cache, kc, vc, kv_store.slots, cos_sin_cache.stride(0),
            kc.stride(0), kc.stride(1), kc.stride(2), kc.shape[1], num_heads * head_dim,
            (num_heads + num_kv_heads) * head_dim)
    return _gemv._launch(x2, weight, scales, 1, t["block_n"], t["block_k"], t["num_warps"],
                         None, False, None, t["stages"], rope=rope, head_dim=head_dim,
                         u8=(zeros, group_size, t["exact"]))


def dequantize_rows(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | float,
                    group_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [K, N] of a ``rows`` weight, in torch (the reference)."""
    q = weight.t().to(torch.float32)  # [K, N]
    g = torch.arange(q.shape[0], device=q.device) // group_size
    z = zeros.to(torch.float32)[g] if isinstance(zeros, torch.Tensor) else float(zeros)
    return ((q - z) * scales.to(torch.float32)[g]).to(dtype)


def int8_gemv_ref(x2: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor | float, group_size: int) -> torch.Tensor:
    """The reference: float32 ``x2 @ dequant(W)``, rounded once to x2's dtype."""
    w = dequantize_rows(weight, scales, zeros, group_size)
    return (x2.to(torch.float32) @ w).to(x2.dtype)
