"""CPU swap space for preemption by swap: a pool of CPU blocks and per-request CPU block
tables. Pure Python; the tensors live in the worker (octavo/worker/swap_cache.py)."""

from __future__ import annotations

from octavo.core.block_pool import BlockPool, KVBlock
from octavo.core.kv_cache_manager import KVCacheManager, cdiv
from octavo.core.request import Request


class SwapSpace:
    """Where requests preempted by swap keep their KV while they wait.

    ``swap_out`` gives a victim CPU blocks for every block of its GPU table and records
    (gpu, cpu) copies; the scheduler then frees the GPU table as for recompute but keeps
    ``num_computed_tokens``. ``try_swap_in`` gives it a fresh GPU table on admission and
    records (cpu, gpu) copies. The worker makes the copies of one step before its forward,
    swap-outs first: a GPU block freed by a swap-out may be a swap-in's (or the step's KV
    writes') destination in the same step.

    Shared GPU blocks (ref count > 1: a prefix-cache hit, a parallel sample's prompt) are
    swapped out like the victim's own: the victim drops its GPU reference and the other
    owners keep the block. The victim then holds no GPU block while it waits, so preempting
    it frees everything it had a claim on, and what it needs on resume cannot be evicted
    once the other owners finish. Keeping a GPU reference instead would pin those blocks in
    the GPU pool after their other owners are done, the opposite of what preemption is for;
    the price of copying is CPU space and transfer time for blocks that stayed on the GPU.

    CPU blocks released by a swap-in return to the pool only when the step's copies are
    taken (``take_step_copies``): a swap-out scheduled later in the same step must not reuse
    a CPU block whose swap-in has not run yet (the worker runs swap-outs first).
    """

    def __init__(self, kv: KVCacheManager, num_cpu_blocks: int, enabled: bool) -> None:
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.kv = kv
        self.pool = BlockPool(num_cpu_blocks) if enabled and num_cpu_blocks else None
        self.req_to_cpu_blocks: dict[str, list[KVBlock]] = {}
        self._swap_out: list[tuple[int, int]] = []  # (gpu, cpu) this step
        self._swap_in: list[tuple[int, int]] = []  # (cpu, gpu) this step
        self._released: list[KVBlock] = []  # CPU blocks of this step's swap-ins
        self._swapped_in_now: set[str] = set()

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks if self.pool is not None else 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks if self.pool is not None else 0

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def is_swapped(self, request: Request) -> bool:
        return request.request_id in self.req_to_cpu_blocks

    def swap_out(self, request: Request) -> bool:
        """Copy the request's GPU table to new CPU blocks. False, changing nothing, when
        swapping is off, the CPU pool lacks room, or there is nothing computed to keep:
        the caller preempts by recompute. The caller frees the GPU blocks either way."""
        rid = request.request_id
        gpu = self.kv.req_to_blocks.get(rid)
        if (self.pool is None or not gpu or request.num_computed_tokens == 0
                or len(gpu) > self.pool.num_free_blocks
                or rid in self._swapped_in_now):  # its swap-in has not run yet
            return False
        cpu = self.pool.allocate(len(gpu))
        self.req_to_cpu_blocks[rid] = cpu
        self._swap_out.extend((g.block_id, c.block_id) for g, c in zip(gpu, cpu))
        return True

    def try_swap_in(self, request: Request, num_new_tokens: int) -> bool:
        """Before admitting ``request`` with ``num_new_tokens`` to compute: when it is
        swapped out, give it a GPU table for its CPU blocks, provided the GPU pool can also
        hold the new tokens (the caller's allocate_slots then succeeds). True when the
        request may go on to allocate_slots: not swapped, or swapped in now."""
        rid = request.request_id
        cpu = self.req_to_cpu_blocks.get(rid)
        if cpu is None:
            return True
        assert rid not in self.kv.req_to_blocks, request
        need = max(len(cpu), cdiv(request.num_computed_tokens + num_new_tokens,
                                  self.kv.block_size))
        if need > self.kv.num_free_blocks:
            return False
        gpu = self.kv.pool.allocate(len(cpu))
        self.kv.req_to_blocks[rid] = gpu
        self._swap_in.extend((c.block_id, g.block_id) for c, g in zip(cpu, gpu))
        del self.req_to_cpu_blocks[rid]
        self._released.extend(cpu)
        self._swapped_in_now.add(rid)
        return True

    def free(self, request: Request) -> None:
        """Release the CPU blocks of a swapped request that finishes (abort, stop)."""
        cpu = self.req_to_cpu_blocks.pop(request.request_id, None)
        if cpu:
            self.pool.free(cpu)

    def take_step_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The step's (gpu, cpu) swap-outs and (cpu, gpu) swap-ins, once per schedule();
        the CPU blocks of its swap-ins become free for later steps."""
        out, self._swap_out = self._swap_out, []
        into, self._swap_in = self._swap_in, []
        if self._released:
            self.pool.free(self._released)
            self._released = []
        self._swapped_in_now.clear()
        return out, into
