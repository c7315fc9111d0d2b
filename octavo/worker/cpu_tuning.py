"""Process settings that matter for CPU inference.

glibc serves allocations above 128 KiB with fresh mmap'd pages and hands them back on free,
so every step's activations, gathered K/V and logits page-fault anew; on the 2-core CI
machine that cost as much as the attention itself (a 2 MB K/V gather: 760 us -> 106 us).
Raising the mmap and trim thresholds keeps those pages in the heap for reuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_done = False


def keep_heap_pages() -> bool:
    """Apply once per process; returns whether glibc accepted the settings."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    # 32 MiB is the largest mmap threshold glibc accepts on 64-bit.
    ok = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20)))
    _done = ok
    if ok:
        logger.info("glibc malloc: mmap/trim thresholds raised for CPU inference")
    return ok
