"""How an OCTAVO_* value is read: the parsers the switch modules share."""

from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def _forced(name: str) -> bool | None:
    """A switch that forces a heuristic's choice: None while unset, else its flag value."""
    return None if os.environ.get(name) is None else _flag(name, False)


def _tile(name: str) -> tuple[int, int, int] | None:
    """An attention tile "BLOCK_N,WARPS,STAGES" from ``name``, or None where unset."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        block_n, warps, stages = (int(v) for v in value.split(","))
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected three integers "
                         "BLOCK_N,WARPS,STAGES (e.g. 64,4,3)") from None
    if block_n < 16 or block_n & (block_n - 1) or warps not in (1, 2, 4, 8) or stages < 1:
        raise ValueError(f"{name}={value!r}: BLOCK_N must be a power of two "
                         ">= 16, WARPS 1, 2, 4 or 8, STAGES >= 1")
    return block_n, warps, stages


def _optional_int(name: str, lo: int, hi: int) -> int | None:
    """A measurement knob: unset or empty, None; else an integer in [lo, hi]."""
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit() or not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value!r}: expected an integer {lo}-{hi}")
    return int(value)


def _int(name: str, default: int, what: str) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        out = int(value)
    except ValueError:
        out = -1
    if out < 0:
        raise ValueError(f"{name} must be a non-negative integer ({what}), got {value!r}")
    return out


def _batch_size(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer (a batch size), got {value!r}") from None
