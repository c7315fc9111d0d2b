"""CPU switches: packed weights, the heap, the C++ kernels and their instruction set."""

from __future__ import annotations

import os

from octavo.envs._parse import _flag


def cpu_packed_gemm() -> bool:
    """OCTAVO_CPU_PACKED_GEMM (default on): oneDNN-packed weights for CPU linear layers."""
    return _flag("OCTAVO_CPU_PACKED_GEMM", True)


def cpu_keep_heap() -> bool:
    """OCTAVO_CPU_KEEP_HEAP (default on): raise glibc's mmap/trim thresholds on CPU."""
    return _flag("OCTAVO_CPU_KEEP_HEAP", True)


def cpu_kernels() -> bool:
    """OCTAVO_CPU_KERNELS (default on): fused C++ CPU ops (norm, rotary, attention, ...),
    compiled on first use; off, or without a compiler, the torch ops run instead."""
    return _flag("OCTAVO_CPU_KERNELS", True)


def cpu_fused_decode() -> bool:
    """OCTAVO_CPU_FUSED_DECODE (default on): CPU decode steps of Llama-style models whose
    linear layers are GGUF-quantized run the decoder stack in one C++ call."""
    return _flag("OCTAVO_CPU_FUSED_DECODE", True)


def cpu_quant_isa() -> str:
    """OCTAVO_CPU_QUANT_ISA (default "auto"): the instruction set of the quantized CPU
    kernels; "avx2" or "scalar" force a portable path ("avx512": VNNI, where built)."""
    value = os.environ.get("OCTAVO_CPU_QUANT_ISA", "auto").strip().lower() or "auto"
    if value not in ("auto", "avx512", "avx2", "scalar"):
        raise ValueError(f"OCTAVO_CPU_QUANT_ISA must be auto, avx512, avx2 or scalar, got "
                         f"{value!r}")
    return value
