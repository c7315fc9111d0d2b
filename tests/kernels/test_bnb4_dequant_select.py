"""The select-tree 4-bit dequantizer (bnb4_gemv.dequantize_4bit_select, the codes compiled into
the kernel) gives the table gather's weights bit for bit: NF4 and FP4 codes, every byte value,
blocks of 64 and 128, ragged tiles, each output dtype."""

from __future__ import annotations

import pytest
import torch

from octavo.kernels.bnb4_gemv import dequantize_4bit, dequantize_4bit_select
from octavo.quantization import bnb_format as fmt
from octavo.quantization.bnb_weight import byte_table


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_select_equals_the_table(device, quant, blocksize, dtype):
    g = torch.Generator().manual_seed(0)
    n, k = 19, 3 * blocksize  # n and k // 2 not multiples of the tiles
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    packed.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)  # every byte value appears
    absmax = torch.rand(n, k // blocksize, generator=g) * 2
    code = fmt.code_table(quant, torch.device("cpu")).float().contiguous()
    dev = torch.device(device)
    want = dequantize_4bit(packed.to(dev), absmax.to(dev), byte_table(code).to(dev), blocksize,
                           dtype)
    got = dequantize_4bit_select(packed.to(dev), absmax.to(dev), tuple(code.tolist()),
                                 blocksize, dtype)
    assert torch.equal(got.cpu(), want.cpu())
