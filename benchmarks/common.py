"""Small helpers shared by the benchmark scripts: device description, git commit, JSON output,
a timed generate call."""

from __future__ import annotations

import collections
import gc
import json
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_info() -> dict[str, Any]:
    """What the benchmark ran on: CPU, cores, torch version and threads, GPU when present."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        info["torch"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def describe_device(info: dict[str, Any] | None = None) -> str:
    """One line describing the device."""
    info = info or device_info()
    parts = [f"{info['cpu']}, {info['cores']} cores"]
    if info.get("gpu"):
        parts.append(f"GPU {info['gpu']} x{info.get('gpu_count', 1)}")
    if info.get("torch"):
        parts.append(f"torch {info['torch']} ({info.get('torch_threads')} threads)")
    if info.get("transformers"):
        parts.append(f"transformers {info['transformers']}")
    return ", ".join(parts)


def _cpu_busy_seconds() -> float | None:
    """Busy CPU-seconds of the whole machine since boot (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:]]
    # user nice system idle iowait irq softirq steal ...; steal is time the host took away
    busy = v[0] + v[1] + v[2] + sum(v[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Average number of cores that *other* processes kept busy between start and stop().

    Machine busy time (/proc/stat) minus this process's CPU time (os.times, all threads). A value
    well above 0 means the figures were measured on a shared, contended CPU.
    """

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._busy0 = _cpu_busy_seconds()
        t = os.times()
        self._own0 = t.user + t.system

    def stop(self) -> float | None:
        busy1 = _cpu_busy_seconds()
        if self._busy0 is None or busy1 is None:
            return None
        t = os.times()
        own = t.user + t.system - self._own0
        wall = time.perf_counter() - self._t0
        return max(0.0, (busy1 - self._busy0 - own) / max(wall, 1e-9))


def wait_for_idle(max_wait_s: float, threshold: float = 0.1, window_s: float = 3.0) -> float | None:
    """Wait (up to max_wait_s) until other processes keep < threshold cores busy over window_s.

    Returns the last measured other-process load (cores), None when it cannot be measured.
    """
    deadline = time.perf_counter() + max_wait_s
    while True:
        probe = OtherLoad()
        time.sleep(window_s)
        load = probe.stop()
        if load is None or load < threshold or time.perf_counter() >= deadline:
            return load


def git_commit(short: bool = True) -> str:
    """Current commit of the repository, with '+dirty' when the tree has changes. A tree
    exported without .git (``git archive`` to a GPU machine) names its commit in a file
    COMMIT at its root; without it, git would report an enclosing checkout's commit."""
    stamp = os.path.join(REPO_ROOT, "COMMIT")
    if not os.path.isdir(os.path.join(REPO_ROOT, ".git")) and os.path.isfile(stamp):
        with open(stamp) as f:
            return f.read().strip() + "+snapshot"
    try:
        args = ["git", "rev-parse", "--short" if short else "--verify", "HEAD"]
        commit = subprocess.run(
            args, cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return commit + ("+dirty" if status else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def print_json_result(result: dict[str, Any], path: str | None = None) -> None:
    """Print the result as one JSON line on stdout, and write it (indented) to `path` if given."""
    line = json.dumps(result, sort_keys=False, default=str)
    print("RESULT_JSON " + line)
    sys.stdout.flush()
    if path:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2, default=str)
            f.write("\n")


def timed_generate(llm, prompts: list, params) -> tuple[float, list]:
    """(wall seconds, outputs) of one ``llm.generate`` call, the device synchronized before
    and after (a CUDA device's queued work is not left out or counted twice)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    return time.perf_counter() - t0, outs


# A sweep over a weight's copies reads at least this much, so each call of a timed sweep reads
# its weight from HBM, not from the (50 MB on an H200) L2.
L2_FLUSH_BYTES = 400 << 20


def flush_copies(nbytes: int) -> int:
    """How many copies of a weight of ``nbytes`` one sweep needs to read ``L2_FLUSH_BYTES``
    (at least two)."""
    return max(2, -(-L2_FLUSH_BYTES // int(nbytes)))


def graph_timed(fns) -> float:
    """Mean microseconds per call over replays of a CUDA graph of one sweep of ``fns``
    (each called once outside the capture first: compiles, cuBLAS algorithm picks)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    reps = 5
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (reps * len(fns))


# Published HBM bandwidth (TB/s) by device name, for the kernel benchmarks' "of HBM" column.
HBM_TBPS = {"H200": 4.8, "H100": 3.35}


def published_hbm_tbps(device_name: str) -> float | None:
    return next((v for k, v in HBM_TBPS.items() if k in device_name), None)


def sweep_rate(nbytes: int, ms: float, copies: int, peak: float | None) -> dict:
    """A weight sweep's timing (``ms`` for ``copies`` reads of ``nbytes``) as microseconds
    per read, TB/s and the fraction of ``peak`` (None: unknown), plus ``"frac"``: that
    fraction as text for a printed row ("" without a peak)."""
    us = ms / copies * 1e3
    tbps = nbytes / (us * 1e-6) / 1e12
    return {"us": round(us, 2), "tbps": round(tbps, 3), "of_peak": peak and round(tbps / peak, 3),
            "frac": f" ({tbps / peak:.0%} of HBM)" if peak else ""}


def graph_median_ms(fn, reps: int = 20) -> float:
    """Median milliseconds of one replay of a CUDA graph of ``fn`` (called once outside the
    capture first: compiles), each replay timed alone with CUDA events."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def time_each(timed, candidates: list[dict], calls) -> list[dict]:
    """A kernel sweep: ``{"cfg", "us"}`` per candidate (``timed(calls(cfg))``: the closures of
    one configuration), or ``"error"`` for a configuration the compiler refuses."""
    results = []
    for cfg in candidates:
        try:
            results.append({"cfg": cfg, "us": round(timed(calls(cfg)), 2)})
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            results.append({"cfg": cfg, "error": f"{type(e).__name__}: {e}"[:200]})
    return results


class TritonCompiles:
    """Triton's JIT compiles while it is entered (``triton.knobs`` hooks, Triton >= 3.4):
    each compile's kernel, specialization key and seconds. A compile inside a timed run is a
    stall of the whole step that needed it."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._start: dict = {}
        self._saved = None

    def __enter__(self) -> TritonCompiles:
        try:
            from triton import knobs
        except ImportError:
            return self
        rt = knobs.runtime
        self._saved = (rt.jit_cache_hook, rt.jit_post_compile_hook)

        def before(*, key, repr, fn, **_):
            self._start[id(key)] = time.perf_counter()
            return None  # None: compile as usual (truthy would skip the compile)

        def after(*, key, repr, fn, **_):
            t0 = self._start.pop(id(key), None)
            self.events.append({"kernel": getattr(fn, "name", str(fn)),
                                "seconds": round(time.perf_counter() - t0, 3) if t0 else None,
                                "key": str(key)[:400]})
            return None

        rt.jit_cache_hook, rt.jit_post_compile_hook = before, after
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            from triton import knobs

            knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._saved


class StackSampler:
    """The calling thread's Python stack every ``interval`` seconds while entered (a daemon
    thread reads ``sys._current_frames()``): where the host was during a slow step, waiting
    on the device (a synchronize, a copy to the host) or in its own work. ``during(t0, t1)``
    gives the samples' stacks in that ``time.perf_counter()`` window, most frequent first.
    Few samples in a long window mean the GIL was held throughout (a C call that keeps it,
    or a garbage collection: ``gc_during`` lists those)."""

    def __init__(self, interval: float = 0.002, depth: int = 10) -> None:
        self.interval, self.depth = interval, depth
        self.samples: list[tuple[float, tuple[str, ...]]] = []
        self.collections: list[tuple] = []
        self._stop = None
        self._thread = None
        self._gc_start: float | None = None
        self._gc_walk: dict | None = None

    def __enter__(self) -> StackSampler:
        target = threading.get_ident()
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(self.interval):
                frame = sys._current_frames().get(target)
                stack = []
                while frame is not None and len(stack) < self.depth:
                    code = frame.f_code
                    stack.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} "
                                 f"{code.co_name}")
                    frame = frame.f_back
                self.samples.append((time.perf_counter(), tuple(stack)))

        self._thread = threading.Thread(target=run, daemon=True, name="stack-sampler")
        self._thread.start()
        gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict) -> None:
        # Collections hold the GIL: a long one starves the sampler, so they are timed here.
        # A full collection also notes what it walks (counted before its clock starts).
        if phase == "start":
            self._gc_walk = None
            if info.get("generation") == 2:
                objs = gc.get_objects(2)
                top = collections.Counter(type(o).__name__ for o in objs).most_common(8)
                self._gc_walk = {"objects": len(objs), "frozen": gc.get_freeze_count(),
                                 "types": top}
                del objs
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.collections.append((self._gc_start, time.perf_counter(),
                                     info.get("generation"), info.get("collected"),
                                     self._gc_walk))
            self._gc_start = None

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_gc)
        self._stop.set()
        self._thread.join()

    def gc_during(self, t0: float, t1: float) -> list[dict]:
        """The garbage collections that started in the window: generation, ms, collected."""
        return [{"generation": g, "ms": round(1e3 * (b - a), 2), "collected": n,
                 **({"walked": walk} if walk else {})}
                for a, b, g, n, walk in self.collections if t0 <= a <= t1]

    def during(self, t0: float, t1: float, top: int = 3) -> list[dict]:
        counts: dict[tuple[str, ...], int] = {}
        for t, stack in self.samples:
            if t0 <= t <= t1:
                counts[stack] = counts.get(stack, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [{"samples": n, "stack": list(stack)} for stack, n in ranked]
