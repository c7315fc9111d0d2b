"""Chained hashes of full KV blocks for automatic prefix caching.

A block's hash covers its own token ids and, through the parent hash, every token before it,
so equal hashes mean equal prefixes (up to 64-bit collisions). Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT_HASH = 0x5EED_0C7A_0000_0000


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    return hash((parent_hash, tuple(token_ids)))


def hash_full_blocks(token_ids: Sequence[int], block_size: int, start_block: int = 0,
                     parent_hash: int = ROOT_HASH) -> list[int]:
    """Hashes of the full blocks of ``token_ids`` from ``start_block`` on."""
    hashes = []
    for b in range(start_block, len(token_ids) // block_size):
        parent_hash = hash_block(parent_hash, token_ids[b * block_size:(b + 1) * block_size])
        hashes.append(parent_hash)
    return hashes
