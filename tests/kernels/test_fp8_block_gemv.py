"""The block-scaled FP8 GEMV with the scales folded into the activations
(``octavo/kernels/fp8_block_gemv.py``) against the float32 reference over the dequantized
weight and against the FP8 GEMV's block mode: small shapes in Triton's CPU interpreter (or
the GPU where there is one) with steps inside one block column (a scale per step) and across
several (a scale per word), partial row and column blocks, the GLU store, K split over
programs; its plan's refusals; an sm_90 compile without spills; Llama-3.1-8B's shapes on the
GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.fp8_block_gemm import fp8_block_gemm_reference, fp8_block_gemv  # noqa: E402
from octavo.kernels.fp8_block_gemv import fp8_block_gemv_folded, plan  # noqa: E402
from tests.kernels.test_fp8_block_gemm import _case, _rel  # noqa: E402


def _want(x, w, s, block, glu):
    want = fp8_block_gemm_reference(x.float(), w, s, block)
    if glu:
        n = w.shape[0]
        want = F.silu(want[:, :n // 2]) * want[:, n // 2:]
    return want


# (n, k, block, tiles = (block_n, block_k, warps, waves, stages)): steps of 4x, 1x and half
# a block column; a column block of 96 (not a power of two) under 256-wide steps; partial
# last row and column blocks; K split over programs (waves 4 on a few tiles).
CASES = [
    ((128, 512, (128, 128)), (32, 512, 4, 1, 2)),
    ((256, 384, (128, 128)), (16, 128, 4, 2, 3)),
    ((128, 256, (64, 128)), (16, 64, 4, 4, 2)),
    ((96, 480, (32, 96)), (32, 256, 4, 1, 2)),
    ((200, 328, (64, 64)), (8, 128, 4, 4, 3)),
]


@pytest.mark.parametrize("shape,tiles", CASES)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_gemv(shape, tiles, m, dtype, device):
    n, k, block = shape
    x, w, s = _case(m, n, k, block, dtype, device, seed=n + k + m)
    got = fp8_block_gemv_folded(x, w, s, block, tiles=tiles)
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel(got, _want(x, w, s, block, False)) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("n,k,block,tiles", [
    (512, 256, (128, 128), (32, 256, 4, 1, 2)),  # a program's 16 gate rows and 16 up rows
    (256, 384, (64, 128), (64, 128, 4, 2, 3)),
    (192, 200, (32, 40), (16, 64, 4, 4, 2)),
])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_gemv_glu(n, k, block, tiles, m, dtype, device):
    x, w, s = _case(m, n, k, block, dtype, device, seed=n * m + k)
    got = fp8_block_gemv_folded(x, w, s, block, glu=True, tiles=tiles)
    assert got.shape == (m, n // 2) and got.dtype == dtype
    want = _want(x, w, s, block, True)
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else 2e-2)
    if block[1] % 32 == 0:  # the block mode's steps fit the columns: its result too
        old = fp8_block_gemv(x, w, s, block, glu=True)
        assert _rel(got, old) < (1e-6 if dtype == torch.float32 else 2e-2)


def test_plan_refuses_what_the_kernel_cannot_hold():
    # Llama-3.1-8B's projections in 128 x 128 blocks: every one has a plan
    for n, k, glu in [(6144, 4096, False), (4096, 4096, False), (28672, 4096, True),
                      (4096, 14336, False)]:
        assert plan(n, k, (128, 128), glu) is not None
    # o's shape at one row: its own plan (session 45's sweep); two rows keep the GEMV's
    assert plan(4096, 4096, (128, 128)) == (16, 1024, 4, 1, 2)
    assert plan(4096, 4096, (128, 128), m=2) == (8, 512, 8, 1, 3)
    assert plan(6144, 4096, (8, 128)) is None  # a program's 16 rows span two block rows
    assert plan(4096, 4096, (128, 6)) is None  # a word's 4 weights span two block columns
    assert plan(28672 + 128, 4096, (128, 128), glu=True) is None  # the up half off a block row
    x, w, s = _case(1, 64, 128, (4, 32), torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"no folded plan for \[64, 128\] in \(4, 32\)"):
        fp8_block_gemv_folded(x, w, s, (4, 32))


def _compile_without_spills(m, block_n, block_k, glu, stages):
    """The folded kernel compiled for sm_90 at a plan over 4 warps: no local memory."""

    from tests.kernels.sm90 import compile_sm90

    code = compile_sm90(
        "octavo.kernels.fp8_block_gemv:_fp8_block_gemv_kernel", "--const", f"BLOCK_M={m}",
        f"BLOCK_N={block_n}", f"BLOCK_K={block_k}", "BITS=0", "X_LOAD=2", f"GLU={int(glu)}",
        f"STAGES={stages}", "PDL=1", "GROUP=128", "ROW_BLOCK=128", "--ptr", "x_ptr=i64",
        "w_ptr=i32", "s_ptr=fp32", "out_ptr=bf16", "part_ptr=fp32", "cnt_ptr=i32", "--div16",
        "K", "N", "K_PER_SPLIT", "stride_xm", "stride_wn", "stride_sn", "--ones", "stride_sg",
        "--num-warps", "4")
    assert code.local_bytes == 0, code.report
    assert "LDL" not in code.sass and "STL" not in code.sass


def test_folded_gemv_compiles_for_sm90_without_spills():
    """Two rows, GLU, the gate_up plan (32 x 256 over 4 warps, two steps ahead): the largest
    register set this kernel takes."""
    _compile_without_spills(2, 32, 256, True, 3)


def test_one_row_plan_for_o_compiles_for_sm90_without_spills():
    """One row, o's plan (16 x 1,024 over 4 warps, one step ahead)."""
    _compile_without_spills(1, 16, 1024, False, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,glu", [(6144, 4096, False), (4096, 4096, False),
                                     (28672, 4096, True), (4096, 14336, False)])
@pytest.mark.parametrize("m", [1, 2])
def test_llama_8b_shapes_on_the_gpu(n, k, glu, m):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs CUDA with e4m3 (compute capability 8.9)")
    x, w, s = _case(m, n, k, (128, 128), torch.bfloat16, "cuda")
    got = fp8_block_gemv_folded(x, w, s, (128, 128), glu=glu)
    assert _rel(got, _want(x, w, s, (128, 128), glu)) < 2e-2
    assert _rel(got, fp8_block_gemv(x, w, s, (128, 128), glu=glu)) < 1e-2
