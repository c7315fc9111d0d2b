"""Fused CPU ops (RMSNorm, SiLU-and-mul, rotary, paged KV store, decode attention) as a C++
extension compiled on first use with ``torch.utils.cpp_extension.load``.

The build lives in torch's extensions cache under a name keyed by the sources, the flags, the
torch version and this CPU's instruction set, so changed sources rebuild and a cache shared
with another machine never loads a binary built for a different CPU. When the build fails (no
compiler, no OpenMP, ...) or ``OCTAVO_CPU_KERNELS=0``, :func:`load` returns None and every
caller keeps its torch code.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
import time
from types import ModuleType

import torch

try:
    import fcntl
except ImportError:  # not POSIX: torch's file lock alone
    fcntl = None

from octavo import envs

logger = logging.getLogger(__name__)

_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("bindings.cpp", "norm.cpp", "activation.cpp", "rotary.cpp", "cache.cpp",
           "attention.cpp", "quant_gemm.cpp", "quant_gemm_vnni16.cpp",
           "quant_gemm_avx2x16.cpp", "decoder.cpp",
           "argmax.cpp", "moe.cpp")
HEADERS = ("common.h", "ops.h", "simd512.h", "attention_chunks.h", "quant_gemm.h")
# -fno-trapping-math: g++ keeps the comparisons of a clamp (fast_exp's) as branches while they
# might raise a floating-point exception, and a loop with branches does not vectorise; Octavo
# never reads the exception flags, and the values are the same IEEE results.
CFLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-DNDEBUG")
LDFLAGS = ("-fopenmp",)
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)

_lock = threading.Lock()
_module: ModuleType | None = None
_tried = False


def _cpu_signature() -> str:
    """This CPU's instruction-set flags (the binary is built with -march=native)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def build_name() -> str:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        with open(os.path.join(_DIR, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    digest.update(repr((CFLAGS, LDFLAGS, torch.__version__, _cpu_signature())).encode())
    # The build files record absolute source paths: two checkouts sharing torch's extension
    # cache would otherwise rebuild over each other's build on every switch (minutes each).
    digest.update(os.path.realpath(_DIR).encode())
    return "octavo_cpu_ops_" + digest.hexdigest()[:16]


@contextlib.contextmanager
def _build_lock(build_dir: str | None):
    """Serialize builds with an OS lock that dies with its holder. torch's own lock is a
    file that a killed builder leaves behind, and every later process then waits on it
    forever; holding this lock proves no live Octavo process is building, so such a file is
    stale and removed."""
    if build_dir is None or fcntl is None:
        yield
        return
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "octavo_build.flock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = os.path.join(build_dir, "lock")
            if os.path.exists(stale):
                logger.warning("removing a stale kernel build lock left by a killed process: "
                               "%s", stale)
                os.remove(stale)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    name = build_name()
    try:  # torch's own cache folder for `name` (a private helper: optional)
        build_dir = cpp_extension._get_build_directory(name, verbose=False)
    except Exception:
        build_dir = None
    fresh = build_dir is None or not os.path.exists(os.path.join(build_dir, name + ".so"))
    if fresh:
        logger.info("compiling Octavo's CPU kernels (once per source version, about a "
                    "minute) into %s", build_dir or "torch's extensions cache")
    start = time.perf_counter()
    with _build_lock(build_dir):
        module = cpp_extension.load(
            name=name,
            sources=[os.path.join(_DIR, s) for s in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=build_dir,
            verbose=False,
        )
    if fresh:
        logger.debug("CPU kernels built in %.1f s", time.perf_counter() - start)
    return module


def load() -> ModuleType | None:
    """The compiled extension, building it on first call; None when off or unbuildable."""
    global _module, _tried
    if _tried:
        return _module
    with _lock:
        if not _tried:
            if envs.cpu_kernels():
                try:
                    _module = _build()
                except Exception as e:  # any build failure means: use torch
                    logger.warning("Octavo CPU kernels unavailable, using torch ops instead "
                                   "(%s: %s)", type(e).__name__, str(e).strip()[-500:])
            _tried = True
    return _module


def ops_for(x: torch.Tensor) -> ModuleType | None:
    """The extension when ``x`` is a CPU tensor of a dtype it handles, else None."""
    if x.device.type != "cpu" or x.dtype not in SUPPORTED_DTYPES:
        return None
    return load()
