"""Cross-check against GPTQModel's own AWQ unpacking where the package is installed (it is not
a dependency: ``pip install --no-deps gptqmodel`` is enough, since only its torch-only
``packing_utils`` file is loaded, without importing the package and its requirements)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from octavo.quantization.awq import AWQ_ORDER
from octavo.quantization.int_weight import unpack_int32
from tests.quantization.packers import awq_tensors, quantize


def _gptqmodel_packing_utils():
    spec = importlib.util.find_spec("gptqmodel")  # finds without importing the package
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gptqmodel is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "quantization", "awq", "utils",
                        "packing_utils.py")
    if not os.path.isfile(path):
        pytest.skip(f"this gptqmodel has no {path}")
    mod_spec = importlib.util.spec_from_file_location("_gptqmodel_awq_packing", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("group", [32, 64])
def test_awq_unpacking_agrees_with_gptqmodel(group):
    pu = _gptqmodel_packing_utils()
    assert list(pu.AWQ_ORDER) == list(AWQ_ORDER)
    torch.manual_seed(group)
    qz = quantize(torch.randn(48, 128), 4, group, sym=False)
    t = awq_tensors(qz)
    theirs = pu.dequantize_gemm(t["qweight"], t["qzeros"], t["scales"], 4, group)  # [in, out]
    q = unpack_int32(t["qweight"], 4, dim=1, order=AWQ_ORDER).float()
    z = unpack_int32(t["qzeros"], 4, dim=1, order=AWQ_ORDER).float().repeat_interleave(group, 0)
    ours = (q - z) * t["scales"].float().repeat_interleave(group, 0)
    # GPTQModel dequantizes in float16: equal up to its rounding.
    torch.testing.assert_close(theirs.float(), ours, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(ours, qz.dequantize().t(), atol=0, rtol=0)
