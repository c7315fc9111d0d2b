"""The tensor-parallel group's all-reduce for small CUDA tensors: one launch over peer-mapped
memory (``octavo.kernels.all_reduce``) instead of NCCL, when every rank's GPU can reach every
other's directly (NVLink / PCIe peer access) and the tensor fits the staging buffers.

Each rank allocates one zeroed region (flags, then two staging buffers), shares it with the
others through CUDA IPC handles (exchanged once, at start-up, over the NCCL group) and keeps
the others' regions mapped. Every rank decides per call from the tensor's size, dtype and
layout alone, so all ranks always take the same path (a rank on NCCL while another spins in
the kernel would hang both). Larger tensors (prefill) keep NCCL.
"""

from __future__ import annotations

import logging

import torch

from octavo.kernels.all_reduce import FLAG_BYTES, GRID, one_shot_all_reduce

logger = logging.getLogger(__name__)

CAP_BYTES = 8 << 20  # per staging buffer: a 1,024-token x 4,096 bf16 activation
MAX_WORLD = 8
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class CustomAllReduce:
    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        import torch.distributed as dist
        from torch.multiprocessing.reductions import reduce_tensor

        self.rank, self.world, self.device = rank, world, device
        self.region = torch.zeros(FLAG_BYTES + 2 * CAP_BYTES, dtype=torch.uint8, device=device)
        self.epochs = torch.zeros(GRID, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)
        handles: list = [None] * world
        dist.all_gather_object(handles, reduce_tensor(self.region))
        self._peers = []  # keeps the peers' mappings open
        addrs = []
        for r, (rebuild, args) in enumerate(handles):
            if r == rank:
                addrs.append(self.region.data_ptr())
                continue
            # Open the handle on this rank's own device: CUDA then maps the peer's memory
            # for access from here (peer access enabled lazily), and this process creates
            # no context on the peer's GPU. (On the peer's device index, as the handle says,
            # the mapping belongs to that device and this GPU's kernels fault on it.)
            args = list(args)
            args[6] = device.index  # rebuild_cuda_tensor's storage_device
            peer = rebuild(*args)
            self._peers.append(peer)
            addrs.append(peer.data_ptr())
        self.bases = torch.tensor(addrs, dtype=torch.int64, device=device)

    def eligible(self, x: torch.Tensor) -> bool:
        return (x.is_cuda and x.dtype in DTYPES and x.is_contiguous()
                and 0 < x.numel() * x.element_size() <= CAP_BYTES)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return one_shot_all_reduce(x, self.bases, self.epochs, self.rank, self.world, CAP_BYTES)


def create(rank: int, world: int, device: torch.device) -> CustomAllReduce | None:
    """A CustomAllReduce on every rank, or None on every rank (peer access missing anywhere,
    a failure while mapping, more than MAX_WORLD ranks): the ranks agree through NCCL."""
    import torch.distributed as dist

    # Every rank's GPU visible here (the mp executor; not Ray actors, which see one each).
    ok = 2 <= world <= MAX_WORLD and torch.cuda.device_count() >= world
    car = None
    if ok:
        others = [d for d in range(torch.cuda.device_count()) if d != device.index]
        ok = all(torch.cuda.can_device_access_peer(device.index, d) for d in others)
    if ok:
        try:
            car = CustomAllReduce(rank, world, device)
        except Exception as e:  # noqa: BLE001 - fall back to NCCL, on every rank
            logger.warning("custom all-reduce unavailable (%s: %s); using NCCL",
                           type(e).__name__, e)
            ok = False
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if int(flag.item()) != 1:
        return None
    logger.info("tensor-parallel all-reduce: one-shot over peer memory for tensors up to "
                "%d MiB, NCCL above", CAP_BYTES >> 20)
    return car
