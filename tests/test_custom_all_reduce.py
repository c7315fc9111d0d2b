"""The one-shot all-reduce over peer GPU memory (two GPUs needed): sums equal to NCCL's for
several sizes and dtypes, eagerly and replayed from a CUDA graph (benchmarks/all_reduce.py
runs the check and times both)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from octavo.distributed.custom_all_reduce import CAP_BYTES, DTYPES


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_equals_nccl_on_two_gpus(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "benchmarks/all_reduce.py", "--json", str(out)], check=True,
                   timeout=300)
    import json

    report = json.loads(out.read_text())
    assert report["checks"] >= 3 * 3 * 3 + 20


def test_eligibility_is_decided_by_the_tensor_alone():
    from octavo.distributed.custom_all_reduce import CustomAllReduce

    car = CustomAllReduce.__new__(CustomAllReduce)  # no devices needed for the rule
    cpu = torch.empty(16, dtype=torch.bfloat16)
    assert not car.eligible(cpu)
    assert torch.bfloat16 in DTYPES and CAP_BYTES >= 2 * 1024 * 4096
