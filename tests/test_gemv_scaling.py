"""benchmarks/gemv_scaling.py's arithmetic (the timings themselves need a GPU)."""

import pytest

from benchmarks.gemv_scaling import KERNELS, fit_line, stream_fit, weight_bytes


def test_fit_line_recovers_fixed_part_and_rate():
    xs = [1e6, 4e6, 16e6, 64e6]
    fixed, per_byte = fit_line(xs, [3.0 + x / 4e6 for x in xs])
    assert fixed == pytest.approx(3.0) and per_byte == pytest.approx(0.25e-6)
    # noisy points: still the least-squares line, not a two-point guess
    fixed, per_byte = fit_line([0, 1, 2, 3], [1.0, 3.1, 4.9, 7.0])
    assert per_byte == pytest.approx(1.98) and fixed == pytest.approx(1.03)


def test_weight_bytes_per_kernel_family():
    k, n = 4096, 1024
    assert weight_bytes("bf16_gemv", k, n) == 2 * k * n
    assert weight_bytes("fp8_mma", k, n) == k * n + 4 * n
    # 4-bit g128: half a byte per weight plus a 16-bit scale and zero point per group
    assert weight_bytes("w4_mma", k, n) == k * n / 2 + 2 * (k // 128) * n * 2
    assert weight_bytes("w8_gemv", k, n) == k * n + 2 * (k // 128) * n * 2
    assert {kernel[:2] for kernel in KERNELS} == {"bf", "fp", "w4", "w8"}


def test_stream_fit_gives_microseconds_and_bytes_per_second():
    # 2 us fixed, then 4 TB/s: 40 MB take 10 us more
    points = [{"bytes": b, "hbm_us": 2.0 + b / 4e12 * 1e6} for b in (10e6, 20e6, 40e6)]
    fixed, rate = stream_fit(points)
    assert fixed == pytest.approx(2.0) and rate == pytest.approx(4e12)
    # a small weight on the kernel's floor (8 us for 1 MB) stays out of the line
    fixed, rate = stream_fit([{"bytes": 1e6, "hbm_us": 8.0}] + points[::-1])
    assert fixed == pytest.approx(2.0) and rate == pytest.approx(4e12)


def test_variants_are_off_by_default_and_parse_to_their_arguments():
    from benchmarks.gemv_scaling import FP8_BLOCK, NF4, VARIANTS, variant

    # 54 before session 44, then the block-scaled FP8 GEMVs' plans and the 4-bit bnb kernels
    assert len(VARIANTS) == 54 + len(FP8_BLOCK) + len(NF4)
    assert not set(VARIANTS) & set(KERNELS)  # not run by default
    for name in VARIANTS:
        base = "_".join(name.split("_")[:2])  # w4_mma, w8_gemv...
        assert weight_bytes(name, 4096, 1024) == weight_bytes(base, 4096, 1024)
    assert weight_bytes("w8_gemv_p2", 4096, 1024) > weight_bytes("w4_gemv_p2", 4096, 1024)
    assert variant("w4_mma_w6") == {"warps_per_sm": 6, "split_ctas": True}
    assert variant("w4_mma_w12_ns") == {"warps_per_sm": 12, "split_ctas": False}
    assert variant("w4_mma") is None and variant("w4_gemv_p2") is None
    assert variant("fp8_gemv_x0") is None  # the float8 GEMV's own argument (x_load)
    from benchmarks.gemv_scaling import _FP8_MMA

    # dense_mma's float8 kernel: fp16 activations and its plan read from the name
    assert _FP8_MMA.fullmatch("fp8_mma_f16_w12s2").groups() == ("_f16", "12", "2")
    assert _FP8_MMA.fullmatch("fp8_mma").groups() == (None, None, None)
    assert {"fp8_mma_f16", "fp8_mma_w16s2", "fp8_mma_f16_w32s4"} <= set(VARIANTS)


def test_block_fp8_and_nf4_variants():
    from benchmarks.gemv_scaling import _FP8_BLOCK, FP8_BLOCK

    # 128 x 128 block scales: a float32 per block on top of a byte per weight
    assert weight_bytes("fp8_block_gemv", 4096, 1024) == 4096 * 1024 + 4 * 8 * 32
    assert weight_bytes("fp8_block_fold_glu", 4096, 1024) == weight_bytes("fp8_block_gemv",
                                                                          4096, 1024)
    # NF4 in blocks of 64: half a byte per weight plus a float32 absmax per block
    assert weight_bytes("nf4_gemv", 4096, 1024) == 4096 * 1024 / 2 + 4 * 4096 * 1024 / 64
    assert _FP8_BLOCK.fullmatch("fp8_block_gemv_32_128_4_2_2").groups() == (
        "32", "128", "4", "2", "2")
    assert {"fp8_block_fold_16_512_4_1_2", "fp8_block_gemv_64_128_8_1_3"} <= set(FP8_BLOCK)
