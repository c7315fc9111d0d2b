"""One-shot all-reduce over peer-mapped GPU memory (NVLink), for the small tensors a decode
step's tensor-parallel layers reduce (a few KB to a few MB, twice per layer).

NCCL's ring takes ~20 us for a 1.6 MB bf16 tensor between two H200s (its LL protocol,
measured in a live TP=2 decode step: 67 calls, 1.35 ms of an 8.2 ms step). Here one launch
of a fixed grid does it: every program copies its slice of the input into this rank's
staging buffer, publishes an epoch in this rank's flag for its slice (release, system scope),
waits until every rank's program of the same index has published the same epoch (acquire),
then sums the slice over every rank's buffer, in rank order (so all ranks get identical
values), reading the peers' buffers over NVLink.

Correctness across calls without host involvement (CUDA graphs replay the same launch):
- Each program keeps its own epoch counter in device memory; the grid is the same for every
  call, so program i's epoch is the call count on every rank.
- Two staging buffers, by epoch parity: a rank writing call c's data into a buffer cannot
  overwrite data a peer still reads for call c - 1 (other parity); for call c - 2 (same
  parity) the peer has finished, since this rank saw the peer's flag for c - 1, published
  only after the peer's whole c - 2 launch.
"""

from __future__ import annotations

import torch

from octavo.kernels.triton_utils import tl, triton

# Programs, all resident at once (the spin-wait needs every peer program running): one per SM
# of an H200 short of a few, each moving 4,096 values per iteration, so a 2 MB tensor takes
# two iterations (each pays a full NVLink round trip; at 64 x 1,024 it took 16, and 25 us).
GRID = 128
FLAG_BYTES = 4096  # the flags region at the start of each rank's shared allocation


@triton.jit
def _one_shot_all_reduce_kernel(
    x_ptr, out_ptr, bases_ptr, epoch_ptr, n, rank, cap_bytes,
    WORLD: tl.constexpr, GRID_SIZE: tl.constexpr, BLOCK: tl.constexpr,
    FLAGS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dt = x_ptr.dtype.element_ty
    epoch = tl.load(epoch_ptr + pid) + 1
    tl.store(epoch_ptr + pid, epoch)
    buf_off = FLAGS + (epoch % 2).to(tl.int64) * cap_bytes
    mine = (tl.load(bases_ptr + rank) + buf_off).to(tl.pointer_type(dt))
    for start in range(pid * BLOCK, n, GRID_SIZE * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n
        tl.store(mine + offs, tl.load(x_ptr + offs, mask=ok), mask=ok)
    tl.debug_barrier()  # the whole slice is written before the flag says so
    my_flags = tl.load(bases_ptr + rank).to(tl.pointer_type(tl.int32))
    tl.atomic_xchg(my_flags + pid, epoch, sem="release", scope="sys")
    for r in tl.static_range(WORLD):
        flags = tl.load(bases_ptr + r).to(tl.pointer_type(tl.int32))
        while tl.atomic_add(flags + pid, 0, sem="acquire", scope="sys") < epoch:
            pass
    tl.debug_barrier()
    for start in range(pid * BLOCK, n, GRID_SIZE * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for r in tl.static_range(WORLD):
            src = (tl.load(bases_ptr + r) + buf_off).to(tl.pointer_type(dt))
            acc += tl.load(src + offs, mask=ok, other=0.0, cache_modifier=".cv").to(tl.float32)
        tl.store(out_ptr + offs, acc.to(dt), mask=ok)


def one_shot_all_reduce(x: torch.Tensor, bases: torch.Tensor, epochs: torch.Tensor, rank: int,
                        world: int, cap_bytes: int) -> torch.Tensor:
    """The sum of ``x`` over the ranks. ``bases`` [world] int64: each rank's shared
    allocation (flags, then two staging buffers of ``cap_bytes``) as mapped in this process;
    ``epochs`` [GRID] int32: this rank's per-program call counters (zeroed once)."""
    out = torch.empty_like(x)
    n = x.numel()
    _one_shot_all_reduce_kernel[(GRID,)](
        x, out, bases, epochs, n, rank, cap_bytes,
        WORLD=world, GRID_SIZE=GRID, BLOCK=4096, FLAGS=FLAG_BYTES, num_warps=8,
    )  # fmt: skip
    return out
