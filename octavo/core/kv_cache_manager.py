"""Maps requests to append-only tables of KV blocks. Pure Python."""

from __future__ import annotations

from octavo.core.block_pool import BlockPool, KVBlock
from octavo.core.prefix_hash import ROOT_HASH, hash_full_blocks
from octavo.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int,
                 enable_prefix_caching: bool = False) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        # Prefix-cache statistics, in tokens (vLLM's prefix_cache_queries / hits).
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        held = len(self.req_to_blocks.get(request.request_id, ()))
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - held)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        Returns the ids of newly added blocks (possibly empty), or None when the pool cannot
        supply them; nothing changes in that case.
        """
        need = self.num_blocks_needed(request, num_new_tokens)
        if need > self.pool.num_free_blocks:
            return None
        new_blocks = self.pool.allocate(need) if need else []
        self.req_to_blocks.setdefault(request.request_id, []).extend(new_blocks)
        return [b.block_id for b in new_blocks]

    def fork(self, child: Request, leader: Request, num_tokens: int) -> tuple[int, int] | None:
        """Give ``child`` the leader's KV for its first ``num_tokens`` tokens: full blocks are
        shared by reference count, a trailing partial block is copied into a fresh block.
        Returns the (source, destination) copy to perform, if any. Needs one free block when
        there is a partial block; the caller checks."""
        assert child.request_id not in self.req_to_blocks
        full, rest = divmod(num_tokens, self.block_size)
        leader_blocks = self.req_to_blocks[leader.request_id]
        shared = leader_blocks[:full]
        self.pool.incref(shared)
        table = list(shared)
        copy = None
        if rest:
            (block,) = self.pool.allocate(1)
            table.append(block)
            copy = (leader_blocks[full].block_id, block.block_id)
        self.req_to_blocks[child.request_id] = table
        return copy

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (see BlockPool.reset_prefix_cache); False while any
        block is in use."""
        return self.pool.reset_prefix_cache()

    def get_computed_blocks(self, request: Request) -> list[KVBlock]:
        """Cached blocks holding a prefix of the request's tokens. At least one token is left
        to compute: the model must run on the last one to produce logits."""
        if not self.enable_prefix_caching:
            return []
        hashes = self._hashes(request)
        usable = (request.num_tokens - 1) // self.block_size
        hits = []
        for h in hashes[:usable]:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def take_computed_blocks(self, request: Request, blocks: list[KVBlock]) -> None:
        """Start the request's table with cached blocks (shared by reference count)."""
        assert request.request_id not in self.req_to_blocks
        self.pool.incref(blocks)
        self.req_to_blocks[request.request_id] = list(blocks)

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        hashes = self._hashes(request)
        full = min(request.num_computed_tokens // self.block_size, len(hashes), len(blocks))
        for i in range(request.num_cached_blocks, full):
            self.pool.cache_block(blocks[i], hashes[i])
        request.num_cached_blocks = max(request.num_cached_blocks, full)

    def block_hashes(self, request: Request) -> list[int]:
        """Chained hashes of the request's full blocks (computed or not)."""
        return self._hashes(request)

    def _hashes(self, request: Request) -> list[int]:
        """Chained hashes of the request's full blocks, extended incrementally."""
        hashes = request.block_hashes
        n_full = request.num_tokens // self.block_size
        if len(hashes) < n_full:
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.extend(hash_full_blocks(request.all_token_ids, self.block_size,
                                           len(hashes), parent))
        return hashes

    def free(self, request: Request) -> None:
        """Release every block of the request, tail first so that the tail is evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free(list(reversed(blocks)))

    def num_held_tokens_capacity(self) -> int:
        return self.pool.num_used_blocks * self.block_size
