"""Triton kernels compiled for Hopper (sm_90) on a machine without a GPU, for tests that
check machine code: ``scripts/triton_sass.py`` in a process of its own (the interpreter's
kernels do not compile), with the ptxas the triton package carries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@dataclass
class Compiled:
    report: str  # triton_sass.py's summary: registers, shared memory, the hot loop
    ptx: str
    sass: str

    @property
    def local_bytes(self) -> int:
        """Local memory (register spills) the report states; fails where it states none."""
        found = re.search(r"local (\d+) B", self.report)
        assert found, self.report
        return int(found.group(1))


def compile_sm90(kernel: str, *args: str) -> Compiled:
    """``kernel`` (module:function) compiled with ``args`` (triton_sass.py's options:
    --const, --ptr, --div16, --num-warps, ...); asserts it compiled."""
    dump = f"/tmp/sm90_{kernel.replace(':', '_').replace('.', '_')}_{os.getpid()}"
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=_ROOT, TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run(
        [sys.executable, os.path.join(_ROOT, "scripts", "triton_sass.py"), kernel, *args,
         "--dump", dump],
        capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(os.path.join(dump, "kernel.ptx")) as ptx, \
            open(os.path.join(dump, "kernel.sass")) as sass:
        return Compiled(run.stdout, ptx.read(), sass.read())
