"""FP8 (e4m3) checkpoint weights of one linear layer, W8A8 or weight-only.

Checkpoint tensors (compressed-tensors ``float-quantized``):

- ``weight`` float8_e4m3fn [out, in]; ``weight_scale`` float32, [out, 1] per channel or one
  number per tensor, ``W = weight * scale``. A merged layer (q/k/v) has one per-tensor scale
  per part: each part's rows keep their own.
- ``input_scale`` float32, one number (static activations only).

Activations (when quantized) go to FP8 the way compressed-tensors does it: the scale is
``amax(|x|) / 448`` per token or per tensor (dynamic) or the stored ``input_scale`` (static),
``x_q = fp8(clamp(x / scale, -448, 448))``.

- On CUDA with FP8 tensor cores (compute capability 8.9+), W8A8 runs ``torch._scaled_mm`` with
  row-wise scales (per token x per output channel); a failure there (an older torch) falls back
  to the path below, once, with a warning. Decode batches of ``CUDA_FP8_ROWS`` rows run the
  CUDA tensor-core kernel for float8 weights (``octavo.kernels.dense_mma``, built with nvcc;
  ``OCTAVO_CUDA_FP8``), those of up to ``fp8_gemv.MAX_M`` rows the FP8-weight GEMV
  (``OCTAVO_FP8_GEMV``): the same weights, the activations left unrounded (at small batches
  quantizing them costs more launches than the GEMM itself).
- Elsewhere, and for a float32 model on any device: the weight is dequantized once at load;
  the activations are quantized and dequantized in the model's dtype (exactly what the
  reference implementation computes), then a plain matmul. (The CUDA paths above give
  16-bit outputs, and leave decode rows unrounded: a float32 model asks for the checkpoint's
  numbers, not for speed.)
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.kernels.triton_available import HAS_TRITON
from octavo.quantization.base import LinearMethod
from octavo.quantization.param_layout import set_param_layout

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_SHARD_INDEX = {"q": 0, "k": 1, "v": 2}
FP8_GEMV_MAX_M = 2  # octavo.kernels.fp8_gemv.MAX_M (not imported here: it imports Triton)
# Rows sent to the CUDA float8 kernel (octavo.kernels.dense_mma). Llama-3.1-8B fp8 on an H200
# (benchmarks/quantized.py, ms per token, docs/benchmarks.md session 20), kernel / without:
# batch 1 3.335 / 2.890 (the FP8 GEMV), 2 3.852 / 4.103 (the GEMV), 4 4.352 / 5.403, 8 4.308 /
# 5.436, 16 6.141 / 5.474 (torch._scaled_mm).
CUDA_FP8_ROWS = (2, 8)


def cuda_mma(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x2`` [m, k] times the float8 ``weight`` [n, k] (float32 ``scale`` per row) through
    the CUDA float8 kernel where this call may take it (a CUDA batch of
    ``OCTAVO_CUDA_FP8_MIN_M``..``OCTAVO_CUDA_FP8_MAX_M`` rows, the kernel built and not turned
    off), else None."""
    if not cuda_mma_takes(x2, weight, scale):
        return None
    from octavo.kernels import dense_mma

    fused = bias is not None and bias.dtype == x2.dtype and bias.is_contiguous()
    y = dense_mma.dense_mma(x2, weight, bias if fused else None, scale.view(-1))
    return y if fused or bias is None else y + bias


def cuda_mma_takes(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether :func:`cuda_mma` runs this call (else it returns None)."""
    if not (x2.is_cuda and envs.cuda_fp8_min_m(CUDA_FP8_ROWS[0]) <= x2.shape[0]
            <= envs.cuda_fp8_max_m(CUDA_FP8_ROWS[1])):
        return False
    from octavo.kernels import dense_mma

    return (dense_mma.fits(x2, weight, None, scale.view(-1))
            and dense_mma.available(x2.device, fp8=True))


def gemv_available() -> bool:
    """At load, for a layer whose FP8 weight stays on CUDA: may its decode rows run the
    FP8-weight GEMV (``OCTAVO_FP8_GEMV``, Triton installed)."""
    return envs.fp8_gemv() and HAS_TRITON


def gemv_applies(layer: nn.Module, x2: torch.Tensor) -> bool:
    """Whether this call of an FP8 layer runs the FP8-weight GEMV: a CUDA batch of at most
    ``FP8_GEMV_MAX_M`` rows, the layer set up for it (``layer.fp8_gemv``)."""
    return layer.fp8_gemv and x2.is_cuda and x2.shape[0] <= FP8_GEMV_MAX_M


def gemv(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
         glu: bool = False) -> torch.Tensor:
    from octavo.kernels.fp8_gemv import fp8_gemv  # imports Triton: CUDA only

    return fp8_gemv(x2, weight, scale, glu=glu)


def gated_gemv(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor | None:
    """An MLP's ``silu(gate) * up`` straight from the FP8 GEMV's store (``glu=True``) for a
    call that runs the GEMV on a merged [gate | up] layer of two equal parts without a bias
    (``OCTAVO_FUSED_GLU``); None otherwise (the caller runs the projection, then the
    activation). Saves the activation's launch per layer (Llama-3.1-8B fp8 batch 1)."""
    sizes = layer.output_partition_sizes
    x2 = x.reshape(-1, x.shape[-1])
    if not (bias is None and len(sizes) == 2 and sizes[0] == sizes[1] and envs.fused_glu()
            and gemv_applies(layer, x2) and not cuda_mma_takes(x2, weight, scale)):
        return None
    y = gemv(x2, weight, scale, glu=True)
    return y.view(*x.shape[:-1], y.shape[-1])


def unit_gated_applies(layer: nn.Module, x2: torch.Tensor, weight: torch.Tensor,
                       scale: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether an MLP's merged [gate | up] FP8 layer (two equal parts, no bias) takes this
    call's gated activation into the unit-scaled GEMM's epilogue (``unit_scaled_mm`` with
    ``glu``; OCTAVO_FP8_UNIT_GLU): rows the GEMV and the CUDA float8 kernel leave, within
    OCTAVO_FP8_TENSORWISE_MAX_M."""
    sizes = layer.output_partition_sizes
    return (bias is None and len(sizes) == 2 and sizes[0] == sizes[1] and envs.fp8_unit_glu()
            and unit_scaled_mm_runs(x2) and envs.fp8_fused_quant()
            and not gemv_applies(layer, x2) and not cuda_mma_takes(x2, weight, scale))


def gemv_qkv_rope(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                  positions: torch.Tensor, cos_sin_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int, kv_store) -> torch.Tensor | None:
    from octavo.kernels.fp8_gemv import fp8_gemv_qkv_rope  # imports Triton: CUDA only

    return fp8_gemv_qkv_rope(x2, weight, scale, positions, cos_sin_cache, num_heads,
                             num_kv_heads, head_dim, kv_store)


def qkv_rope_gemv(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                  scale: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                  cos_sin_cache: torch.Tensor, kv_store) -> torch.Tensor | None:
    """A qkv projection's q with the rotary embedding applied, and its rotated k and its v
    in the paged cache, straight from the FP8 GEMV's store (``fp8_gemv_qkv_rope``) for a
    call that runs the GEMV on a QKVParallelLinear without a bias (OCTAVO_FUSED_QKV_ROPE,
    on by default); None otherwise, with nothing done (the caller runs the
    projection, then the rotary). Saves the rotary launch per layer."""
    x2 = x.reshape(-1, x.shape[-1])
    if not (bias is None and envs.fused_qkv_rope() and hasattr(layer, "num_kv_heads")
            and gemv_applies(layer, x2) and not cuda_mma_takes(x2, weight, scale)):
        return None
    q = gemv_qkv_rope(x2, weight, scale, positions.reshape(-1), cos_sin_cache,
                      layer.num_heads, layer.num_kv_heads, layer.head_dim, kv_store)
    return None if q is None else q.view(*x.shape[:-1], q.shape[-1])


def fused_quant(x2: torch.Tensor, static_scale: torch.Tensor | None, min_scale: float,
                small: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The activations to fp8 in one launch (``octavo.kernels.fp8_quant``) where it runs
    (CUDA, Triton, ``OCTAVO_FP8_FUSED_QUANT``); None elsewhere (the caller's torch path)."""
    if not (x2.is_cuda and HAS_TRITON and envs.fp8_fused_quant()):
        return None
    from octavo.kernels.fp8_quant import fp8_quant  # imports Triton: CUDA only

    return fp8_quant(x2.contiguous(), static_scale, min_scale, small)


_UNIT_SCALES: dict[torch.device, torch.Tensor] = {}
_ACC_DTYPE: dict[torch.device, torch.dtype] = {}  # where float32 output is refused


def unit_scaled_mm_runs(x2: torch.Tensor) -> bool:
    """Whether :func:`unit_scaled_mm` takes a batch of ``x2``'s rows (else it returns None):
    CUDA with Triton, OCTAVO_FP8_TENSORWISE on, at most OCTAVO_FP8_TENSORWISE_MAX_M rows."""
    return (x2.is_cuda and HAS_TRITON and envs.fp8_tensorwise()
            and x2.shape[0] <= envs.fp8_tensorwise_max_m())


def unit_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                   row_scale: torch.Tensor, bias: torch.Tensor | None,
                   dtype: torch.dtype, glu: bool = False) -> torch.Tensor | None:
    """``(xq * x_scale) @ (weight * row_scale)^T + bias`` in ``dtype`` for FP8 ``xq`` [m, k]
    with float32 ``x_scale`` ([m, 1] per token, or one number) and float32 ``row_scale``
    per output row: ``torch._scaled_mm`` with unit scales into float32, then one launch
    applying both scale vectors and the bias, rounded once (``octavo.kernels.outer_scale``).
    On an H200 cuBLAS's unit-scaled kernels ran Llama-3.1-8B's projections at 16 rows in 69
    us a layer where the row-wise recipe took 117 (session 45). None where this does not run
    (OCTAVO_FP8_TENSORWISE off, more than OCTAVO_FP8_TENSORWISE_MAX_M rows, no Triton):
    the caller runs the row-wise recipe. ``glu``: the weight is an MLP's [gate | up]; the
    epilogue returns ``silu(gate) * up`` (``outer_scale``'s GLU mode)."""
    if not unit_scaled_mm_runs(xq):
        return None
    from octavo.kernels.outer_scale import outer_scale  # imports Triton: CUDA only

    device = xq.device
    one = _UNIT_SCALES.get(device)
    if one is None:  # made once, before any graph capture (the warm-up steps)
        one = _UNIT_SCALES[device] = torch.ones((), device=device, dtype=torch.float32)
    acc_dtype = _ACC_DTYPE.get(device, torch.float32)
    try:
        acc = torch._scaled_mm(xq, weight.t(), one, one, out_dtype=acc_dtype)
    except RuntimeError:  # a build without float32 output: bf16 sums, rounded twice
        if acc_dtype != torch.float32:
            raise
        acc_dtype = _ACC_DTYPE[device] = torch.bfloat16
        acc = torch._scaled_mm(xq, weight.t(), one, one, out_dtype=acc_dtype)
    return outer_scale(acc, x_scale, row_scale, bias, dtype, glu=glu)


def activation_scale(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    """Dynamic FP8 scale of ``x`` [m, k]: [m, 1] per token, else [1, 1]."""
    amax = x.abs().amax(dim=-1, keepdim=True) if per_token else x.abs().amax().reshape(1, 1)
    scale = amax / FP8_MAX
    # An all-zero row would divide by zero: any positive scale quantizes it to zeros.
    return torch.where(scale > 0, scale, torch.finfo(x.dtype).eps)


def qdq_fp8_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` [..., K] rounded through FP8 with a dynamic scale per ``group`` columns of each
    row (compressed-tensors' dynamic "group" activations; a last partial group its own)."""
    k = x.shape[-1]
    pad = -k % group
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    g = xp.reshape(*x.shape[:-1], -1, group)
    out = qdq_fp8(g, activation_scale(g, per_token=True)).reshape(xp.shape)
    return out[..., :k] if pad else out


def dequantize_fp8(q: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """An FP8 weight [out, in] times its float scale per output row, float32."""
    return q.float() * row_scale.float().reshape(-1)[:, None]


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def qdq_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` rounded through FP8 with ``scale``, back in x's dtype."""
    return quantize_fp8(x, scale).to(x.dtype) * scale.to(x.dtype)


def scaled_mm_usable(device: torch.device) -> bool:
    return (device.type == "cuda" and hasattr(torch, "_scaled_mm")
            and torch.cuda.get_device_capability(device) >= (8, 9))


def _per_part_loader(layer: nn.Module):
    """One scalar per merged part (q, k, v / gate, up), placed at the part's index."""
    def load(param, loaded, shard_id=None):
        if loaded.numel() != 1:
            raise ValueError(f"layer {layer.prefix!r}: expected one per-tensor scale, got "
                             f"shape {tuple(loaded.shape)}")
        index = 0 if shard_id is None else _SHARD_INDEX.get(shard_id, shard_id)
        param.data[index] = loaded.reshape(())
    return load


class Fp8LinearMethod(LinearMethod):
    """``weight_strategy``: "tensor" | "channel"; ``activations``: None (weight-only),
    "dynamic-token", "dynamic-tensor" or "static-tensor"."""

    has_qkv_rope = True

    def __init__(self, weight_strategy: str, activations: str | None) -> None:
        self.weight_strategy = weight_strategy
        self.activations = activations

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        self.partition_sizes = list(output_partition_sizes)
        k, n = input_size_per_partition, sum(output_partition_sizes)
        parts = len(output_partition_sizes)

        def param(name, shape, dtype, **layout):
            p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, set_param_layout(p, **layout))
            return p

        param("weight", (n, k), FP8, input_dim=1, output_dim=0)
        if self.weight_strategy == "channel":
            param("weight_scale", (n, 1), torch.float32, output_dim=0)
        else:
            param("weight_scale", (parts,), torch.float32).weight_loader = \
                _per_part_loader(layer)
        if self.activations == "static-tensor":
            # Every part reads the same input: calibration gives each the same scale.
            param("input_scale", (parts,), torch.float32).weight_loader = \
                _per_part_loader(layer)

    def process_weights_after_loading(self, layer):
        weight = layer.weight.data
        scale = layer.weight_scale.data
        if self.weight_strategy == "tensor":  # one per part -> one per output row
            scale = torch.repeat_interleave(
                scale, torch.tensor(self.partition_sizes, device=scale.device))
        scale = scale.reshape(-1, 1).to(torch.float32)
        input_scale = None
        if self.activations == "static-tensor":
            input_scale = layer.input_scale.data.amax().reshape(1, 1)
            del layer.input_scale
        del layer.weight, layer.weight_scale
        layer.register_buffer("act_scale", input_scale, persistent=False)
        k, n = weight.shape[1], weight.shape[0]
        keep = getattr(layer, "keeps_fp8", None)  # a grouped MoE kernel's device rule
        if keep is not None and keep(weight):
            # Experts kept as stored for ``fused_moe``'s FP8 path, which runs them
            # weight-only (activations not rounded to FP8, W8A8 schemes included).
            layer.fp8_mm = False
            layer.register_buffer("weight_fp8", weight, persistent=False)
            layer.register_buffer("weight_scale", scale.reshape(-1).contiguous(),
                                  persistent=False)
            return
        # A float32 model computes the checkpoint's arithmetic as the reference does (the
        # path below): the FP8 kernels round their output to 16 bits and leave one- and
        # two-row activations unrounded, which no float32 comparison can hold.
        layer.fp8_mm = (self.activations is not None and scaled_mm_usable(weight.device)
                        and self.params_dtype != torch.float32
                        and k % 16 == 0 and n % 16 == 0)
        layer.fp8_out_dtype = None
        if layer.fp8_mm:
            # _scaled_mm wants the second operand column-major: [n, k] row-major, transposed.
            layer.register_buffer("fp8_weight", weight, persistent=False)
            layer.register_buffer("fp8_weight_scale", scale.reshape(1, -1).contiguous(),
                                  persistent=False)
            layer.fp8_gemv = gemv_available()
            return
        self._dequantize(layer, weight, scale)

    def _dequantize(self, layer, weight, scale) -> None:
        w = dequantize_fp8(weight, scale).to(self.params_dtype)
        layer.register_buffer("dequantized_weight", w, persistent=False)

    def _input_scale(self, layer, x2: torch.Tensor) -> torch.Tensor:
        if self.activations == "static-tensor":
            return layer.act_scale  # float32, as stored
        return activation_scale(x2, per_token=self.activations == "dynamic-token")

    def apply(self, layer, x, bias):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if layer.fp8_mm and (y := cuda_mma(x2, layer.fp8_weight, layer.fp8_weight_scale,
                                           bias)) is not None:
            return y.view(*shape[:-1], y.shape[-1])
        if layer.fp8_mm and gemv_applies(layer, x2):
            y = gemv(x2, layer.fp8_weight, layer.fp8_weight_scale)
            y = y if bias is None else y + bias
            return y.view(*shape[:-1], y.shape[-1])
        if layer.fp8_mm:
            try:
                y = self._scaled_mm(layer, x2)
                y = y if bias is None else y + bias
                return y.view(*shape[:-1], y.shape[-1])
            except RuntimeError as e:  # e.g. row-wise scales unsupported by this build
                logger.warning("layer %r: torch._scaled_mm failed (%s); using dequantized "
                               "FP8 weights", layer.prefix, e)
                layer.fp8_mm = False
                self._dequantize(layer, layer.fp8_weight, layer.fp8_weight_scale.reshape(-1, 1))
                del layer.fp8_weight, layer.fp8_weight_scale
        if self.activations is not None:
            x2 = qdq_fp8(x2, self._input_scale(layer, x2))
        w = getattr(layer, "dequantized_weight", None)
        if w is None:  # kept in FP8 for a grouped kernel; a call that runs elsewhere
            w = dequantize_fp8(layer.weight_fp8, layer.weight_scale)
        y = F.linear(x2, w if w.dtype == x2.dtype else w.to(x2.dtype), bias)
        return y.view(*shape[:-1], y.shape[-1])

    def apply_gated(self, layer, x, bias):
        if not layer.fp8_mm:
            return None
        return gated_gemv(layer, x, layer.fp8_weight, layer.fp8_weight_scale, bias)

    def apply_qkv_rope(self, layer, x, bias, positions, cos_sin_cache, kv_store):
        if not layer.fp8_mm:
            return None
        return qkv_rope_gemv(layer, x, layer.fp8_weight, layer.fp8_weight_scale, bias,
                             positions, cos_sin_cache, kv_store)

    def _scaled_mm(self, layer, x2: torch.Tensor) -> torch.Tensor:
        m = x2.shape[0]
        fused = None
        if self.activations != "dynamic-tensor":  # the kernel's scales are per row
            static = layer.act_scale if self.activations == "static-tensor" else None
            fused = fused_quant(x2, static, torch.finfo(torch.float32).eps, "replace")
        if fused is not None:
            x_fp8, x_scale = fused
        else:
            x_scale = self._input_scale(layer, x2.float()).expand(m, 1).contiguous()
            x_fp8 = quantize_fp8(x2.float(), x_scale)
        y = unit_scaled_mm(x_fp8, x_scale, layer.fp8_weight, layer.fp8_weight_scale.view(-1),
                           None, x2.dtype)
        if y is not None:
            return y
        # Row-wise scales come with bfloat16 output on every build that has them; the input's
        # own dtype where the build allows it (remembered per layer).
        out_dtypes = [layer.fp8_out_dtype] if layer.fp8_out_dtype else [x2.dtype, torch.bfloat16]
        for i, out_dtype in enumerate(out_dtypes):
            try:
                y = torch._scaled_mm(x_fp8, layer.fp8_weight.t(), scale_a=x_scale,
                                     scale_b=layer.fp8_weight_scale, out_dtype=out_dtype)
            except RuntimeError:
                if i + 1 == len(out_dtypes):
                    raise
                continue
            layer.fp8_out_dtype = out_dtype
            return y.to(x2.dtype)
        raise AssertionError("unreachable")

    def dense_weight(self, layer):
        # With quantized activations the layer is not ``x W^T``: no oneDNN shortcut.
        return getattr(layer, "dequantized_weight", None) if self.activations is None else None
