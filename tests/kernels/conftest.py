"""Kernel tests: run the Triton kernels through the interpreter on CPU-only machines (the C++
CPU kernels of ``test_cpu_ops.py`` run natively).

``TRITON_INTERPRET`` must be set before Triton is first imported, so it happens here, at
collection time. Where CUDA is available the kernels run natively (and the ``gpu`` tests too).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if importlib.util.find_spec("triton") is None:  # the C++ CPU kernels need no Triton
    collect_ignore = [name for name in os.listdir(os.path.dirname(__file__))
                      if name.startswith("test_") and name.endswith(".py")
                      and name != "test_cpu_ops.py"]


@pytest.fixture
def device() -> torch.device:
    """Where the small-shape tests run: the GPU when there is one, else the CPU interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
