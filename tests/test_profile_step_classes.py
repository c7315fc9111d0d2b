"""benchmarks/profile_step.py's kernel classes: the decode GEMVs that replaced cuBLAS kernels
count as GEMMs, so the profile's GEMM row (and its HBM fraction of the weights' bytes) keeps
covering every projection."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
classify = importlib.import_module("benchmarks.profile_step").classify
overlap_note = importlib.import_module("benchmarks.profile_step").overlap_note


def test_an_overlapped_table_says_so():
    """Under PDL the kernels overlap and their times add up to more than the step."""
    note = overlap_note(True, False, 7.912, 2.555)
    assert note and "OCTAVO_PDL=0" in note and "7.912" in note
    assert overlap_note(True, False, 2.6, 2.555) is None   # within 5%: the table holds
    assert overlap_note(False, False, 7.9, 2.555) is None  # PDL off
    assert overlap_note(True, True, 7.9, 2.555) is None    # eager: no captured chain


def test_triton_gemvs_and_gemms_are_gemms():
    for name in ("_dense_gemv_kernel", "_int_weight_gemv_kernel", "_fp8_gemv_kernel",
                 "_skinny_gemm_kernel", "_int_weight_gemm_kernel",
                 # the 4-bit swap-AB GEMM and its large-batch dequantization (W4A16's
                 # gate_up / down: a batch-1 profile put 52% of the step under "other")
                 "_swapab_kernel", "_dequantize_kernel",
                 "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_TNT",
                 # the CUDA C++ decode GEMMs (float and float8 weights)
                 "dense_mma_bf16_m1_n1_s4", "dense_mma_bf16_e4m3_m1_n1_s2"):
        assert classify(name) == "gemm", name


def test_other_classes_are_unchanged():
    assert classify("_paged_attention_kernel") == "attention"
    assert classify("_split_reduce_kernel") == "attention"
    # stream-K decode attention and its once-per-step work list (session 27)
    assert classify("_streamk_decode_kernel") == "attention"
    assert classify("_work_list_kernel") == "attention"
    assert classify("_rms_norm_kernel") == "norm_rotary_act"
    assert classify("_race_kernel") == "sampling"
