"""A pool of fixed-size KV blocks with reference counts and a free queue. Pure Python."""

from __future__ import annotations

from collections import OrderedDict


class KVBlock:
    """Metadata of one KV block; the tensors live in the worker."""

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt})"


class BlockPool:
    """Owns every block. Allocation takes from the head of the free queue (least recently
    freed first), freeing appends to the tail, so a later prefix cache can evict in LRU order.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        # Prefix cache: hash of a full block -> the block holding it (in use or free).
        self.cached: dict[int, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def allocate(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks (ref count 1 each); ValueError if fewer are free. Free blocks
        still holding a cached prefix are evicted in least-recently-freed order."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            assert block.ref_cnt == 0, block
            if block.block_hash is not None:  # evict the least recently freed cached block
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                self.num_evictions += 1
            block.ref_cnt = 1
            block.block_hash = None
            out.append(block)
        return out

    def cache_block(self, block: KVBlock, block_hash: int) -> None:
        """Register a full, computed block under its prefix hash (first holder wins)."""
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, so later requests compute their prompts again (e.g.
        between benchmark runs over the same prompts). Only while no block is in use: a
        running request's blocks may be shared through the cache. Returns whether it was
        reset."""
        if self.num_used_blocks:
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        return True

    def lookup(self, block_hash: int) -> KVBlock | None:
        return self.cached.get(block_hash)

    def incref(self, blocks: list[KVBlock]) -> None:
        """Share blocks: a block with ref count 0 leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the free queue's tail
        in the order given."""
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
