"""Whether Triton is installed, without importing it (``import triton`` costs ~70 MB of RSS
and a second of start-up, which a CPU engine never uses). Kernel modules import Triton through
``triton_utils``; code above them asks here first and imports a kernel module only on CUDA."""

from __future__ import annotations

import importlib.util

HAS_TRITON = importlib.util.find_spec("triton") is not None
