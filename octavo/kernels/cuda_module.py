"""CUDA C++ kernels of our own (``octavo/kernels/cuda/*.cu``), built with ``nvcc`` at first use
and launched through the CUDA driver API (ctypes): no PyTorch extension build, so a module
compiles in seconds and its launches capture into CUDA graphs like any other.

A module is built once per source text (with the shared headers, ``cuda/*.cuh``), GPU
architecture and ``nvcc`` version into ``$OCTAVO_CACHE_DIR/cuda`` (default
``~/.cache/octavo/cuda``) and loaded once per device. Where there is no ``nvcc``
(``$CUDA_HOME/bin`` or ``PATH``) or no NVIDIA GPU, ``module`` gives None and callers keep their
Triton kernels (whether the engine uses a module at all is the caller's switch:
``OCTAVO_CUDA_KERNELS``, ``OCTAVO_CUDA_DENSE``). A launch can carry programmatic dependent
launch (``octavo.kernels.pdl``); such a kernel must keep that module's contract
(``griddepcontrol.wait`` before reading what other kernels write and before writing).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "cuda"
_LOCK = threading.Lock()
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
STATIC_SHARED_LIMIT = 48 * 1024  # dynamic shared memory past this needs the attribute raised
# Sources with Hopper-only instructions (wgmma, setmaxnreg): built for the arch-specific target
# (sm_90a), which runs on sm_90 devices only.
ARCH_SPECIFIC = frozenset({"swapab_wgmma.cu"})


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union (an int here).
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


class CudaError(RuntimeError):
    pass


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(msg))
        raise CudaError(f"{what}: CUDA error {result} ({(msg.value or b'?').decode()})")


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def cache_dir() -> Path:
    return Path(os.environ.get("OCTAVO_CACHE_DIR") or Path.home() / ".cache" / "octavo") / "cuda"


def build(source: str, arch: str, nvcc: str | None = None, extra: tuple[str, ...] = ()
          ) -> Path:
    """The cubin of ``octavo/kernels/cuda/<source>`` for ``arch`` (e.g. "sm_90"), compiled
    now unless cached. Raises ``CudaError`` with nvcc's message when it does not compile."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise CudaError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    # The source and the headers it may include (octavo/kernels/cuda/*.cuh): a header's
    # change rebuilds every source.
    text = (SOURCE_DIR / source).read_bytes() + b"".join(
        h.read_bytes() for h in sorted(SOURCE_DIR.glob("*.cuh")))
    # -split-compile=0: the kernels' optimization passes on every core (the same SASS,
    # compared with cuobjdump; 33 -> 23 s for swapab_mma.cu on two cores).
    flags = ["-cubin", "-O3", "-std=c++17", f"-gencode=arch=compute_{arch[3:]},code={arch}",
             "-split-compile=0", *extra]
    key = hashlib.sha256(text + " ".join(flags).encode() + _nvcc_version(nvcc).encode())
    out = cache_dir() / f"{Path(source).stem}-{arch}-{key.hexdigest()[:16]}.cubin"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    logger.info("Building the CUDA kernels of %s for %s with nvcc (once: cached in %s)",
                source, arch, out.parent)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / out.name
        proc = subprocess.run([nvcc, *flags, "-o", str(target), str(SOURCE_DIR / source)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise CudaError(f"nvcc failed on {source} for {arch}:\n{proc.stderr[-4000:]}")
        os.replace(target, out)  # atomic: a concurrent build loses nothing
    return out


class Module:
    """One source's kernels on one device."""

    def __init__(self, source: str, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        self.device = torch.device("cuda", index)
        suffix = "a" if source in ARCH_SPECIFIC else ""
        self.cubin = build(source, f"sm_{major}{minor}{suffix}")
        self._functions: dict[str, ctypes.c_void_p] = {}
        self._shared: dict[str, int] = {}  # the dynamic shared memory each kernel may take
        with torch.cuda.device(index):
            torch.cuda.current_stream()  # the runtime's primary context is current here
            self._module = ctypes.c_void_p()
            _check(_driver().cuModuleLoadData(ctypes.byref(self._module),
                                              self.cubin.read_bytes()),
                   f"loading {self.cubin.name}")

    def function(self, name: str) -> ctypes.c_void_p:
        fn = self._functions.get(name)
        if fn is None:
            fn = ctypes.c_void_p()
            _check(_driver().cuModuleGetFunction(ctypes.byref(fn), self._module, name.encode()),
                   f"kernel {name}")
            self._functions[name] = fn
        return fn

    def launch(self, name: str, grid: tuple[int, int, int], block: int, args: list,
               pdl: bool = False, shared_bytes: int = 0) -> None:
        """Launch kernel ``name`` on the current stream; ``args``: ctypes values in the
        kernel's parameter order; ``shared_bytes``: its dynamic shared memory (past 48 KiB
        the kernel's limit is raised first, once)."""
        fn = self.function(name)
        if shared_bytes > max(STATIC_SHARED_LIMIT, self._shared.get(name, 0)):
            _check(_driver().cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED, shared_bytes),
                   f"raising {name}'s dynamic shared memory to {shared_bytes} bytes")
            self._shared[name] = shared_bytes
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        attr = _LaunchAttribute()
        nattr = 0
        if pdl:
            attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value = 1
            nattr = 1
        config = _LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, shared_bytes, stream,
                               ctypes.pointer(attr), nattr)
        _check(_driver().cuLaunchKernelEx(ctypes.byref(config), fn, params, None),
               f"launching {name}")


_SHARED_OPTIN = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


def shared_optin(device: torch.device) -> int:
    """The most shared memory a CTA may take on ``device`` once its kernel opts in (the
    driver's figure: sm_90 227 KiB)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    value = ctypes.c_int()
    _check(_driver().cuDeviceGetAttribute(ctypes.byref(value), _SHARED_OPTIN, index),
           "reading the device's opt-in shared memory")
    return value.value


def aligned_rows(x2: torch.Tensor) -> torch.Tensor:
    """``x2`` [M, K] as the mma kernels read activations (cuda/mma_common.cuh ``load_x``):
    16-byte pieces of contiguous rows; a copy where its rows are not so."""
    if x2.stride(1) != 1 or x2.stride(0) % 8:
        return x2.contiguous()
    # A view from an odd offset: ``contiguous`` would hand it back as it is.
    return x2.clone() if x2.data_ptr() % 16 else x2


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous from a 16-byte boundary, as the kernels' 16-byte copies read it (a
    packed weight, its scales); a copy where it is not."""
    t = t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


def loaded(source: str, device: torch.device) -> Module:
    """``module(source, device)``, raising where it cannot be built or loaded (a direct call
    of a kernel; the engine asks ``module`` first and keeps its Triton kernels)."""
    mod = module(source, device)
    if mod is None:
        raise RuntimeError(f"the CUDA kernels of {source} are unavailable on {device}")
    return mod


def arguments(*values) -> list:
    """A kernel's parameters as ctypes values, in order: a tensor as its data pointer, None as
    a null pointer, an int as a C int."""
    out = []
    for v in values:
        if v is None or isinstance(v, torch.Tensor):
            out.append(ctypes.c_void_p(None if v is None else v.data_ptr()))
        else:
            out.append(ctypes.c_int(int(v)))
    return out


_MODULES: dict[tuple[str, torch.device], Module | None] = {}


def module(source: str, device: torch.device) -> Module | None:
    """``source``'s kernels on ``device``, or None where they cannot be built or loaded
    (logged once)."""
    if device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source, torch.device("cuda", index))
    if key in _MODULES:  # every call of an eager decode step: no lock once built
        return _MODULES[key]
    with _LOCK:
        if key not in _MODULES:
            try:
                _MODULES[key] = Module(source, key[1])
            except (CudaError, OSError, subprocess.SubprocessError) as e:
                logger.warning("CUDA kernels of %s unavailable on %s (%s); the Triton "
                               "kernels run instead", source, key[1], e)
                _MODULES[key] = None
        return _MODULES[key]
