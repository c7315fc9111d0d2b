"""Triton kernels compiled for Hopper (sm_90) on a machine without a GPU, for tests that
check machine code: ``scripts/triton_sass.py`` in a process of its own (the interpreter's
kernels do not compile), with the ptxas the triton package carries.

The process stays up for the next compile of the same test process when the environment is
the same (starting Python, torch and Triton took ~3 of each check's ~4-5 s on CI's two cores,
for about thirty checks a run); a different environment (a test's monkeypatched variable)
gets a process of its own, as each compile did before."""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TIMEOUT_S = 600

# Serves ``scripts/triton_sass.py``'s main, a JSON argument list a line on stdin, a JSON
# answer a line on the descriptor it was handed; anything else written to its stdout or
# stderr (Python's, or the C++ side's) goes to its log, and comes back with the answer.
_SERVER = r"""
import contextlib, io, json, os, sys, traceback
answers = os.fdopen(int(sys.argv[1]), "w")
log_fd = int(sys.argv[2])
os.dup2(log_fd, 1)
os.dup2(log_fd, 2)
sys.path.insert(0, os.path.join(sys.argv[3], "scripts"))
sys.argv = [os.path.join(sys.argv[3], "scripts", "triton_sass.py")]  # its usage lines' name
import triton_sass
for line in sys.stdin:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = triton_sass.main(json.loads(line))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        err.write(traceback.format_exc())
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    answers.write(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
                  + "\n")
    answers.flush()
"""


class _Compiler:
    """One serving process, for one environment."""

    def __init__(self, env: dict[str, str]) -> None:
        import tempfile

        self.log = tempfile.TemporaryFile()
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(write_fd), str(self.log.fileno()), _ROOT],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(write_fd, self.log.fileno()), env=env, text=True)
        os.close(write_fd)
        self.answers = os.fdopen(read_fd, "r")

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        start = os.fstat(self.log.fileno()).st_size
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        while not select.select([self.answers], [], [], 1.0)[0]:
            if self.proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                self.close()
                raise subprocess.TimeoutExpired(argv, TIMEOUT_S)
        line = self.answers.readline()
        self.log.seek(start)
        logged = self.log.read().decode(errors="replace")
        if not line:  # the process died
            self.close()
            return self.proc.returncode or 1, "", logged
        answer = json.loads(line)
        return answer["rc"], answer["stdout"], answer["stderr"] + logged

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.answers.close()
        self.log.close()


_COMPILERS: dict[tuple, _Compiler] = {}


@atexit.register
def _close_all() -> None:
    while _COMPILERS:
        _COMPILERS.popitem()[1].close()


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    key = tuple(sorted(env.items()))
    compiler = _COMPILERS.get(key)
    if compiler is None or compiler.proc.poll() is not None:
        compiler = _COMPILERS[key] = _Compiler(env)
    rc, out, err = compiler.run(argv)
    if compiler.proc.poll() is not None:
        del _COMPILERS[key]
    return rc, out, err


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
    # Not the interpreter's switch, nor pytest's name of the running test (which would key a
    # process per test).
    env = {key: v for key, v in os.environ.items()
           if key not in ("TRITON_INTERPRET", "PYTEST_CURRENT_TEST")}
    env.update(PYTHONPATH=_ROOT, TRITON_DEFAULT_FP_FUSION="1")
    rc, out, err = _run([kernel, *args, "--dump", dump], env)
    assert rc == 0, out + err
    with open(os.path.join(dump, "kernel.ptx")) as ptx, \
            open(os.path.join(dump, "kernel.sass")) as sass:
        return Compiled(out, ptx.read(), sass.read())
