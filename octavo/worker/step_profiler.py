"""A window of a worker's steps under torch.profiler (OCTAVO_PROFILE_STEPS=START:STOP).

Where a live engine's device time goes, per rank: the steps of a real workload (their
batch and context mix), not a synthetic one. At the window's end the worker writes
``profile_rank{R}_pid{P}.json`` to OCTAVO_PROFILE_DIR: the window's wall time, the device
time of each kernel name (total, launches) and the union of kernel intervals (device busy),
so idle gaps between steps show as wall minus busy.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict

import torch

from octavo import envs

logger = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, rank: int, device: torch.device) -> None:
        self.window = envs.profile_steps()
        self.rank = rank
        self.device = device
        self.step = 0
        self._prof = None
        self._t0 = 0.0

    def before_step(self) -> None:
        """Called as each step is launched: the window closes as step STOP starts (the
        device is synchronized first, so the window holds whole steps)."""
        if self.window is None:
            return
        if self._prof is not None and self.step == self.window[1]:
            self._stop()
        if self.step == self.window[0]:
            self._start()
        self.step += 1

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize(self.device)
        self._prof = profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def _stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        path = os.path.join(envs.profile_dir(),
                            f"profile_rank{self.rank}_pid{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(summarize(prof, wall, self.window[1] - self.window[0]), f, indent=1)
        logger.info("step profile written to %s", path)


def summarize(prof, wall_s: float, steps: int) -> dict:
    """Per-kernel device time of a finished profile, and the device-busy union."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    intervals = []
    cuda = torch.autograd.DeviceType.CUDA
    for ev in prof.events():
        if getattr(ev, "device_type", None) != cuda:
            continue
        tr = ev.time_range
        k = kernels[ev.name]
        k[0] += tr.end - tr.start
        k[1] += 1
        intervals.append((tr.start, tr.end))
    busy = 0.0
    end = float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {"steps": steps, "wall_ms": 1e3 * wall_s, "device_busy_ms": busy / 1e3,
            "kernels": [{"name": n, "us": round(us, 1), "launches": c} for n, (us, c) in top]}
