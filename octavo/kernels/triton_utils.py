"""Shared helpers for the Triton kernels: optional import, launch heuristics.

Triton is an optional dependency. Every kernel module imports ``triton``/``tl`` from here so that
the pure-torch references stay importable (and usable by the CPU backend) without Triton; the
Triton wrappers then raise a clear error when called.
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

    class _JitStub:
        """Stands in for ``triton``: ``@triton.jit`` leaves the function as plain Python."""

        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

    triton = _JitStub()  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

__all__ = [
    "HAS_TRITON",
    "interpreting",
    "triton",
    "tl",
    "next_power_of_2",
    "num_compute_units",
    "require_triton",
]


def require_triton(what: str) -> None:
    """Raise a helpful error when a Triton kernel is called without Triton installed."""
    if not HAS_TRITON:
        raise RuntimeError(
            f"{what} needs Triton, which is not installed; install 'octavo[triton]' or use the "
            "pure-torch reference (*_ref)"
        )


def interpreting() -> bool:
    """Whether kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), which has no
    inline PTX: kernels take their plain-Triton branch there."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_power_of_2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a small constant elsewhere)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sm_count(index)
    return 4


def vocab_splits(rows: int, vocab: int, block: int, device: torch.device) -> tuple[int, int]:
    """(programs per row, columns each) for a one-pass kernel over [rows, vocab] logits in
    blocks of ``block``: enough programs to fill ``device`` (about two per SM), each at least
    a few blocks of the vocabulary and a whole number of blocks."""
    target = 2 * num_compute_units(device)
    splits = max(1, min(-(-target // max(rows, 1)), -(-vocab // (4 * block))))
    cols_per_split = -(-vocab // splits)
    cols_per_split = -(-cols_per_split // block) * block
    return -(-vocab // cols_per_split), cols_per_split
