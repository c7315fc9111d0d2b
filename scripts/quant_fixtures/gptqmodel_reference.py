"""transformers over a GPTQ / AWQ checkpoint through GPTQModel, as a float32 reference: its
plain torch kernels chosen, then each quantized layer switched to GPTQModel's own dequantization
(unpacking, zero-point convention, g_idx) done in float32 and a float32 matmul.

Why not the kernels as they are: they dequantize with the checkpoint's float16 scales (AWQ's
also casts the activations to float16), about 1e-3 off in logprobs, enough to flip a near-tie of
a random model. Needs GPTQModel (and optimum); see make_gptq_awq.py for the venv.
"""

from __future__ import annotations

import json
import os

import torch


def load_reference_model(folder: str, method: str):
    """transformers' model over the checkpoint, its quantized layers GPTQModel's plain torch
    kernels (GPTQ "torch", AWQ "torch_awq"), which dequantize and then multiply."""
    from transformers import AutoModelForCausalLM, AwqConfig, GPTQConfig

    # GPTQModel torch.compiles its dequantization; on a 30-layer model that recompiles past
    # dynamo's limit and crawls. The reference runs eagerly.
    torch._dynamo.config.disable = True
    with open(os.path.join(folder, "config.json")) as f:
        qconfig = json.load(f)["quantization_config"]
    bits = qconfig["bits"]
    qcfg = (AwqConfig(bits=bits, backend="torch_awq") if method == "awq"
            else GPTQConfig(bits=bits, backend="torch"))
    model = AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", dtype=torch.float32,
                                                 quantization_config=qcfg)
    if qconfig.get("lm_head"):
        model.lm_head = _quantized_lm_head(folder)
    return model.eval()


def _quantized_lm_head(folder: str):
    """GPTQModel's own quantized linear for a checkpoint's quantized LM head (lm_head=True).

    transformers' GPTQ integration leaves the head out: its load report lists lm_head.qweight...
    as unexpected and lm_head.weight as missing, and it initializes a random head (or ties the
    embedding). GPTQModel's loader swaps in its quantized linear; it runs only in float16 or
    bfloat16, so it loads in float16 (the checkpoint's scales' dtype: exact) and only its head
    is kept, for ``to_float32_math`` to switch like the other layers. A tied model's head is
    thereby untied: the checkpoint's quantized head, not the embedding."""
    from gptqmodel import BACKEND, GPTQModel

    head = GPTQModel.load(folder, device="cpu", backend=BACKEND.TORCH,
                          dtype=torch.float16).model.lm_head
    if not type(head).__module__.startswith("gptqmodel.nn_modules.qlinear"):
        raise RuntimeError(f"{folder}: GPTQModel did not load a quantized lm_head "
                           f"({type(head).__name__})")
    return head


def _float32_forward(module, method: str):
    """The layer's forward: GPTQModel's own dequantization in float32 (once: the weights do
    not change), a float32 matmul."""
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm

    cache: list[torch.Tensor] = []

    def forward(x):
        if not cache:
            if method == "awq":
                w = dequantize_gemm(module.qweight, module.qzeros, module.scales.float(),
                                    module.bits, module.group_size)
            else:
                w = module.dequantize_weight()  # [in, out], in the scales' dtype
            cache.append(w.float())
        y = x.reshape(-1, x.shape[-1]).float() @ cache[0]
        if module.bias is not None:
            y = y + module.bias.float()
        return y.reshape(*x.shape[:-1], -1)
    return forward


def to_float32_math(model, method: str) -> list[str]:
    """Switch every GPTQModel layer to ``_float32_forward``; the kernels' class names."""
    kernels = set()
    for m in model.modules():
        if type(m).__module__.startswith("gptqmodel.nn_modules.qlinear"):
            kernels.add(type(m).__name__)
            if method != "awq":
                m.scales = m.scales.float()  # exact: float16 values
            m.forward = _float32_forward(m, method)
    return sorted(kernels)
