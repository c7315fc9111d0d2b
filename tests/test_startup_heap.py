"""freeze_startup_heap: a serving process's startup objects leave the collector's reach
(gc.freeze), unless OCTAVO_FREEZE_STARTUP_HEAP=0. Run in a child process: freezing pytest's
own heap would keep later tests' garbage alive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import gc
from octavo.startup_heap import freeze_startup_heap
startup = [[i] for i in range(1000)]
freeze_startup_heap()
print(gc.get_freeze_count())
"""


@pytest.mark.parametrize("flag, frozen", [(None, True), ("0", False)])
def test_freeze_startup_heap(flag, frozen):
    env = dict(os.environ)
    env.pop("OCTAVO_FREEZE_STARTUP_HEAP", None)
    if flag is not None:
        env["OCTAVO_FREEZE_STARTUP_HEAP"] = flag
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert (int(out.strip()) >= 1000) == frozen
