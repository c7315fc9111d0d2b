"""Maps requests to append-only tables of KV blocks. Pure Python."""

from __future__ import annotations

from octavo.core.block_pool import BlockPool, KVBlock
from octavo.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}

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

    def free(self, request: Request) -> None:
        """Release every block of the request, tail first so that the tail is evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free(list(reversed(blocks)))

    def num_held_tokens_capacity(self) -> int:
        return self.pool.num_used_blocks * self.block_size
