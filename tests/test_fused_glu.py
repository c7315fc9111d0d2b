"""The MLP's fused activation hook (``RowParallelLinear.forward_glu``,
``LinearMethod.apply_glu``): methods without a fused kernel decline, so the MLP runs its
activation and the plain projection; the FP8 method (no fused kernel) and the unquantized one
off CUDA decline. The fused kernel itself is tested in tests/kernels/test_dense_gemv.py
(interpreter) and, in an engine on the GPU, tests/kernels/test_dense_mma_fp8.py."""

from __future__ import annotations

import torch

from octavo.models.llama import LlamaMLP


def _mlp(quant_config=None) -> LlamaMLP:
    torch.manual_seed(0)
    mlp = LlamaMLP(64, 96, quant_config, prefix="model.layers.0.mlp")
    for mod in (mlp.gate_up_proj, mlp.down_proj):
        for p in mod.parameters():
            p.data.normal_(0, 0.1)
        mod.process_weights_after_loading()
    return mlp


def test_unquantized_down_projection_declines_and_the_mlp_is_unchanged():
    mlp = _mlp()
    x = torch.randn(3, 64)
    gate_up = mlp.gate_up_proj(x)
    assert mlp.down_proj.forward_glu(gate_up) is None
    expect = mlp.down_proj(torch.nn.functional.silu(gate_up[:, :96]) * gate_up[:, 96:])
    torch.testing.assert_close(mlp(x), expect)


def test_fp8_method_declines():
    from octavo.quantization.fp8 import Fp8Config

    cfg = Fp8Config()
    mlp = _mlp(cfg)
    x = torch.randn(1, 64)
    gate_up = mlp.gate_up_proj(x)
    assert mlp.down_proj.quant_method.apply_glu(mlp.down_proj, gate_up, None) is None
    assert mlp.down_proj.forward_glu(gate_up) is None
    assert torch.isfinite(mlp(x)).all()
