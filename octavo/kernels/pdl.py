"""Programmatic dependent launch (PDL, Hopper and later) for the decode path's Triton kernels.

A decode step at batch 1 is a chain of ~300 short kernels: each waits for the previous one to
drain and then ramps up from an idle GPU, a few microseconds per launch that no bandwidth
buys back. Launched with PDL, a kernel's programs are placed on the SMs while the previous
kernel is still finishing; they run their preamble (weights, which no kernel of the step
writes, can be loaded already) and then block in ``griddepcontrol.wait`` until the previous
kernel has completed and its writes are visible.

The contract every kernel here keeps (``begin``): nothing that another kernel of the step
writes is read, and nothing is written, before the wait. Kernels that are not launched with
PDL (cuBLAS, torch) keep ordinary stream order, so mixing them is safe. Captured CUDA graphs
keep the programmatic edges. ``OCTAVO_PDL=0`` turns it off.
"""

from __future__ import annotations

import functools

import torch

from octavo import envs
from octavo.kernels.triton_utils import HAS_TRITON, tl, triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # Triton without grid dependency control (or none at all)
    gdc_launch_dependents = gdc_wait = None


@functools.cache
def _device_supports(index: int) -> bool:
    # NVIDIA Hopper or later (ROCm also reports "cuda" devices, with capabilities of its own).
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` are launched with PDL."""
    if device.type != "cuda" or not HAS_TRITON or gdc_wait is None:
        return False
    if not envs.pdl():
        return False
    return _device_supports(device.index if device.index is not None
                            else torch.cuda.current_device())


def launch_args(device: torch.device) -> dict:
    """Keyword arguments for a kernel launch: the kernel's ``PDL`` constexpr, and Triton's
    ``launch_pdl`` option when it is on (the two must agree: a PDL launch whose kernel never
    waits would race with the previous kernel)."""
    if enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def begin(PDL: tl.constexpr):
    """Let the next kernel's programs be placed, then wait until the previous kernel has
    completed. Call before the first read of anything the step's other kernels write and
    before any write."""
    trigger(PDL)
    wait(PDL)


@triton.jit
def trigger(PDL: tl.constexpr):
    """``begin``'s first half, for a kernel with work to do before its wait: let the next
    kernel's programs be placed."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """``begin``'s second half: wait until the previous kernel has completed (after
    ``trigger``; the same contract as ``begin`` from here on)."""
    if PDL:
        gdc_wait()
