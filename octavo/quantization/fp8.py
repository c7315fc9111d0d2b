"""FP8 (float8_e4m3fn) weights: vLLM's online quantization of a float checkpoint
(``quantization="fp8"``), and checkpoints that declare ``quant_method: "fp8"``.

- ``"fp8"``: each checkpoint weight (each of q/k/v, gate/up on its own) gets one float32 scale,
  ``amax / 448``, and ``round(w / scale)`` in e4m3 (saturated at +-448).
- ``"fp8-per-channel"``: one scale per output row instead.
- Pre-quantized: ``weight`` float8_e4m3fn with ``weight_scale`` (one per tensor, or per
  output row) or ``weight_scale_inv`` (blocks of ``weight_block_size``, DeepSeek-style);
  ``input_scale`` (``activation_scheme: "static"``) is used as the activations' scale.

Every layer ends with an fp8 weight [out, in] and a float32 scale per output row (a
per-tensor scale repeated: merged parts keep their own scales exactly, nothing is
requantized). Block-scaled checkpoints are dequantized at load to the model dtype.

Compute:

- CUDA with compute capability >= 8.9 (Ada, Hopper): ``torch._scaled_mm`` with row-wise
  scales: the activations quantized to fp8 per token (dynamic, ``amax / 448`` per row) or with
  the checkpoint's static scale, the weight's per-row scale; output in bfloat16 (row-wise
  scaling's output type), cast to the model dtype. Needs in/out features divisible by 16.
  Up to OCTAVO_FP8_TENSORWISE_MAX_M rows the same products run as a unit-scaled
  ``_scaled_mm`` into float32 plus one epilogue launch for the scales and the bias
  (``fp8_linear.unit_scaled_mm``: cuBLAS's unit-scaled kernel is 1.5-1.8x faster there).
  Decode batches of 1-2 rows run the FP8-weight GEMV instead (``OCTAVO_FP8_GEMV``), 2-8 the
  CUDA float8 kernel: the same fp8 weight and row scales, the activations not rounded to
  fp8.
- Elsewhere: the weight dequantized once at load (``fp8 * scale``) to the model dtype,
  activations unquantized: the weight's rounding is kept, the matmul is a float one.

``torch._scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
use_fast_accum=False)`` has this schema in torch 2.11 and 2.13; scales are tensors.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.quantization import fp8_linear
from octavo.quantization.base import LinearMethod, QuantizationConfig, ignored_modules
from octavo.quantization.merged_parts import part_order, part_rows, rank_box

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_MIN_SCALE = 1e-12


def quantize_fp8(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [out, in], float32 scale [out] or []) with ``w ~= q * scale``."""
    w = w.float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=_MIN_SCALE)
    q = (w / (scale[:, None] if per_channel else scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


dequantize_fp8 = fp8_linear.dequantize_fp8


def dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor,
                      block: tuple[int, int]) -> torch.Tensor:
    """A block-scaled fp8 weight [out, in] -> float32 (``scale_inv`` [ceil(out / bo),
    ceil(in / bi)] multiplies each block, as DeepSeek-V3 and vLLM read it):
    ``fused_moe.dequantize_fp8_weight``, which the FP8 kernels' references share."""
    from octavo.kernels.fused_moe import dequantize_fp8_weight

    return dequantize_fp8_weight(q, scale_inv, block)


def blocks_kept_dense(device: torch.device, k: int) -> bool:
    """Whether a dense layer of a block-scaled checkpoint keeps its FP8 blocks
    (``OCTAVO_FP8_BLOCK_KEPT``, CUDA of compute capability 8.9+, Triton importable); else it
    dequantizes at load."""
    from octavo.kernels.triton_utils import HAS_TRITON

    return envs.fp8_block_kept() and HAS_TRITON and use_scaled_mm(device) and k % 4 == 0


def use_scaled_mm(device: torch.device) -> bool:
    """FP8 tensor cores: CUDA devices of compute capability 8.9 and above."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, row_scale: torch.Tensor,
                     input_scale: torch.Tensor | None,
                     bias: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """``x @ (weight * row_scale)^T + bias`` through ``torch._scaled_mm``: x quantized per
    token (``input_scale`` None) or with the static scale; float32 scales. Up to
    OCTAVO_FP8_TENSORWISE_MAX_M rows the GEMM runs with unit scales
    (``fp8_linear.unit_scaled_mm``); else the row-wise recipe with bfloat16 output, the
    bias added after. ``glu`` (a call ``fp8_linear.unit_gated_applies`` took, no bias):
    ``silu(gate) * up`` of the merged [gate | up] output, from the unit GEMM's epilogue."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    fused = fp8_linear.fused_quant(x2, input_scale, _MIN_SCALE, "clamp")
    if fused is not None:
        xq, x_scale = fused
    else:
        if input_scale is None:
            x_scale = (x2.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(
                min=_MIN_SCALE)
        else:
            x_scale = input_scale.float().reshape(1, 1).expand(x2.shape[0], 1).contiguous()
        xq = (x2.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    if fused is not None and (y := fp8_linear.unit_scaled_mm(
            xq, x_scale, weight, row_scale, bias, x.dtype, glu=glu)) is not None:
        return y.view(*shape[:-1], y.shape[-1])
    assert not glu, "the gated epilogue runs only where unit_gated_applies said so"
    y = torch._scaled_mm(xq, weight.t(), x_scale, row_scale.view(1, -1),
                         out_dtype=torch.bfloat16)
    y = y.to(x.dtype).view(*shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class Fp8LinearMethod(LinearMethod):
    has_qkv_rope = True

    def __init__(self, per_channel: bool, prequantized: bool,
                 block: tuple[int, int] | None, static_input: bool,
                 block_scale_name: str = "weight_scale_inv",
                 act_group: int | None = None) -> None:
        self.per_channel = per_channel
        self.prequantized = prequantized
        self.block = block
        self.static_input = static_input
        # The blocks' scales: weight_scale_inv (DeepSeek, transformers' FP8) or weight_scale
        # (compressed-tensors' block strategy).
        self.block_scale_name = block_scale_name
        # Dynamic FP8 activations per group of this many columns (compressed-tensors' FP8_BLOCK
        # preset): applied where the weight is dequantized (the CPU, calls outside the FP8
        # kernels); the kept blocks' GPU kernels run weight-only.
        self.act_group = act_group

    def checkpoint_params(self) -> dict[str, torch.dtype | None]:
        if not self.prequantized:
            return {"weight": None}
        names = {"weight": FP8}
        names[self.block_scale_name if self.block else "weight_scale"] = torch.float32
        if self.static_input:
            names["input_scale"] = torch.float32
        return names

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        layer.fp8_parts = {}
        for name, dtype in self.checkpoint_params().items():
            # Placeholders: each part is quantized (or kept) whole as it arrives.
            p = nn.Parameter(torch.empty(0, dtype=dtype or params_dtype), requires_grad=False)
            p.weight_loader = functools.partial(self._receive, layer, name)
            layer.register_parameter(name, p)

    def _receive(self, layer, name, param, loaded, shard_id=None) -> None:
        part = layer.fp8_parts.setdefault(shard_id, {})
        if name in part:
            raise ValueError(f"layer {layer.prefix!r}: {name} of part {shard_id!r} loaded twice")
        loaded = loaded.to(param.device)
        if name != "weight":
            part[name] = loaded
            return
        r0, rows, c0, cols = rank_box(layer, shard_id, *loaded.shape)
        if self.prequantized:  # narrowed once its scales are known (blocks need the offsets)
            part["weight"] = loaded
            part["box"] = (r0, rows, c0, cols)
        else:
            part["weight"], part["weight_scale"] = quantize_fp8(
                loaded[r0:r0 + rows, c0:c0 + cols], self.per_channel)

    def _part(self, layer, sid, part) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp8 or float weight [rows, cols] for this rank, float32 scale per row)."""
        missing = [n for n in self.checkpoint_params() if n not in part]
        if missing:
            raise ValueError(f"layer {layer.prefix!r}: part {sid!r} lacks {missing}")
        w = part["weight"]
        if not self.prequantized:
            s = part["weight_scale"]
            return w, s if s.dim() else s.expand(w.shape[0])
        r0, rows, c0, cols = part["box"]
        if self.block:
            dense = dequantize_blocks(w, part[self.block_scale_name], self.block)
            return dense[r0:r0 + rows, c0:c0 + cols], torch.ones(rows, device=w.device)
        s = part["weight_scale"].float().reshape(-1)
        if s.numel() not in (1, w.shape[0]):
            raise ValueError(f"layer {layer.prefix!r}: weight_scale has {s.numel()} values for "
                             f"{w.shape[0]} output rows (one, or one per row)")
        s = s.expand(w.shape[0]) if s.numel() == 1 else s
        return w[r0:r0 + rows, c0:c0 + cols], s[r0:r0 + rows]

    def _blocks_kept(self, layer, parts) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(fp8 weight [n, k], float32 scales [ceil(n / bo), ceil(k / bi)]) of this rank's
        parts, kept in their blocks, where every part's slice starts on a block edge and
        every part but the last spans whole blocks of rows, and the kernels' K steps fit the
        block columns (a power of two, 32 or more); else None (dequantize)."""
        bo, bi = self.block
        if bi < 32 or bi & (bi - 1):
            return None
        weights, scales = [], []
        order = part_order(layer, parts)
        for i, sid in enumerate(order):
            part = parts[sid]
            if any(name not in part for name in self.checkpoint_params()):
                return None  # _part names what is missing
            w, s = part["weight"], part[self.block_scale_name].float()
            r0, rows, c0, cols = part["box"]
            offset, _ = part_rows(layer, sid)
            full_r, full_c = w.shape
            if tuple(s.shape) != (-(-full_r // bo), -(-full_c // bi)):
                raise ValueError(f"layer {layer.prefix!r}: {self.block_scale_name} of part {sid!r} is "
                                 f"{tuple(s.shape)}, not one per {self.block} block of "
                                 f"{(full_r, full_c)}")
            last = i == len(order) - 1
            if (r0 % bo or c0 % bi or offset % bo or (rows % bo and not last)
                    or (cols % bi and c0 + cols != full_c)):
                return None
            weights.append(w[r0:r0 + rows, c0:c0 + cols])
            scales.append(s[r0 // bo:r0 // bo + -(-rows // bo), c0 // bi:c0 // bi + -(-cols // bi)])
        return torch.cat(weights), torch.cat(scales).contiguous()

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        parts = layer.fp8_parts
        del layer.fp8_parts
        names = list(self.checkpoint_params())
        device = getattr(layer, names[0]).device
        for name in names:
            delattr(layer, name)
        n, k = layer.output_size_per_partition, layer.input_size_per_partition
        # A grouped mixture-of-experts kernel that runs FP8 weights as they are
        # (``QuantizedExperts`` sets ``keeps_fp8``, its device rule).
        keep = getattr(layer, "keeps_fp8", None)
        kept = keep(torch.empty(0, device=device)) if keep is not None else (
            self.block is not None and blocks_kept_dense(device, k))
        layer.fp8_runs = False  # the weight_fp8 / weight_scale paths of apply() run
        layer.fp8_gemv = False
        if self.block and kept and not parts:  # load_format="dummy": random blocks
            bo, bi = self.block
            layer.register_buffer("weight_fp8", quantize_fp8(
                torch.empty(n, k, device=device).uniform_(-1e-3, 1e-3), False)[0],
                persistent=False)
            layer.register_buffer("weight_block_scale", torch.full(
                (-(-n // bo), -(-k // bi)), 1e-3 / FP8_MAX, device=device), persistent=False)
            layer.fp8_input_scale = None
            return
        if self.block and kept and parts:
            blocked = self._blocks_kept(layer, parts)
            if blocked is not None:
                layer.register_buffer("weight_fp8", blocked[0], persistent=False)
                layer.register_buffer("weight_block_scale", blocked[1], persistent=False)
                layer.fp8_input_scale = None
                return
        if not parts:  # load_format="dummy": random weights, quantized as at load
            q, s = quantize_fp8(torch.empty(n, k, device=device).uniform_(-1e-3, 1e-3),
                                self.per_channel)
            decoded = [(None, (q, s.expand(n) if s.dim() == 0 else s))]
        else:
            decoded = [(sid, self._part(layer, sid, parts[sid]))
                       for sid in part_order(layer, parts)]
        input_scale = None
        if self.static_input and parts:  # one activation scale for the layer: the largest part's
            input_scale = torch.stack([parts[sid]["input_scale"].float().reshape(())
                                       for sid, _ in decoded]).max()
        weight = torch.empty(n, k, device=device, dtype=decoded[0][1][0].dtype)
        row_scale = torch.empty(n, device=device, dtype=torch.float32)
        for sid, (w, s) in decoded:
            offset, rows = part_rows(layer, sid)
            if tuple(w.shape) != (rows, k):
                raise ValueError(f"layer {layer.prefix!r}: part {sid!r} is {tuple(w.shape)}, "
                                 f"the layer holds {(rows, k)}")
            weight[offset:offset + rows] = w
            row_scale[offset:offset + rows] = s
        layer.fp8_input_scale = input_scale
        runs = use_scaled_mm(device) and n % 16 == 0 and k % 16 == 0
        if weight.dtype == FP8 and (runs or kept):
            layer.register_buffer("weight_fp8", weight, persistent=False)
            layer.register_buffer("weight_scale", row_scale, persistent=False)
            layer.fp8_runs = runs
            layer.fp8_gemv = runs and fp8_linear.gemv_available()
            return
        dense = weight.float() if weight.dtype != FP8 else dequantize_fp8(weight, row_scale)
        layer.register_buffer("dequantized_weight", dense.to(self.params_dtype),
                              persistent=False)

    def _block_apply(self, layer, x: torch.Tensor, glu: bool = False) -> torch.Tensor | None:
        """A dense layer's kept FP8 blocks on CUDA (``blocks_kept_dense``): 1-2 rows through
        the block GEMV (weight-only), more through ``block_scaled_mm`` (W8A8 on the FP8
        tensor cores, OCTAVO_FP8_BLOCK_SCALED_MM) or, where that does not run, up to
        OCTAVO_FP8_BLOCK_GEMM_MAX_M rows through ``fp8_block_gemm`` (weight-only); None past
        those (the caller dequantizes per call) and, with ``glu``, where the GEMV does not
        run."""
        from octavo.kernels.triton_utils import interpreting

        x2 = x.reshape(-1, x.shape[-1])
        m = x2.shape[0]
        if not (x2.is_cuda or interpreting()):
            return None
        from octavo.kernels import fp8_block_gemm as kernels

        w, s = layer.weight_fp8, layer.weight_block_scale
        if kernels.block_supported(m, x2.shape[1], self.block):
            y = kernels.fp8_block_gemv(x2, w, s, self.block, glu=glu)
        elif glu:
            return None
        else:
            y = kernels.block_scaled_mm(x2, w, s, self.block) if envs.fp8_block_scaled_mm() \
                else None
            if y is None and m <= envs.fp8_block_gemm_max_m():
                y = kernels.fp8_block_gemm(x2, w, s, self.block)
            if y is None:
                return None
        return y.view(*x.shape[:-1], y.shape[-1])

    def _kept_dense(self, layer, dtype: torch.dtype) -> torch.Tensor:
        """A weight kept in FP8 for a grouped kernel or the decode kernels only, dequantized
        for a call that runs elsewhere (the experts' loop; a kept dense layer's batch that
        ``_block_apply`` leaves: no blockwise ``_scaled_mm`` and more than
        OCTAVO_FP8_BLOCK_GEMM_MAX_M rows): on CUDA straight to ``dtype`` in one launch, else
        float32."""
        block = getattr(layer, "weight_block_scale", None)
        if block is not None and layer.weight_fp8.is_cuda:
            from octavo.kernels.fp8_block_gemm import dequantize

            return dequantize(layer.weight_fp8, block, self.block, dtype)
        if block is not None:
            return dequantize_blocks(layer.weight_fp8, block, self.block)
        return dequantize_fp8(layer.weight_fp8, layer.weight_scale)

    @staticmethod
    def _dense_blocks(layer) -> bool:
        """Whether ``layer`` is a dense layer (not an expert's, which the grouped kernel
        runs) holding its FP8 blocks for ``fp8_block_gemm``'s kernels."""
        return (getattr(layer, "weight_block_scale", None) is not None
                and getattr(layer, "keeps_fp8", None) is None)

    def apply(self, layer, x, bias):
        w = getattr(layer, "dequantized_weight", None)
        if w is None and self._dense_blocks(layer):
            y = self._block_apply(layer, x)
            if y is not None:
                return y if bias is None else y + bias
        if w is None and not layer.fp8_runs:
            w = self._kept_dense(layer, x.dtype)
        if w is not None and self.act_group:
            x = fp8_linear.qdq_fp8_groups(x, self.act_group)
        if w is not None:
            return F.linear(x, w if w.dtype == x.dtype else w.to(x.dtype), bias)
        x2 = x.reshape(-1, x.shape[-1])
        y = fp8_linear.cuda_mma(x2, layer.weight_fp8, layer.weight_scale, bias)
        if y is not None:  # decode batches: the CUDA float8 kernel, activations unrounded
            return y.view(*x.shape[:-1], y.shape[-1])
        if fp8_linear.gemv_applies(layer, x2):
            # Decode batches of 1-2 rows: the FP8-weight GEMV, activations unrounded (here
            # quantizing them costs more launches than the GEMM).
            y = fp8_linear.gemv(x2, layer.weight_fp8, layer.weight_scale).view(
                *x.shape[:-1], layer.weight_fp8.shape[0])
        else:
            return scaled_mm_linear(x, layer.weight_fp8, layer.weight_scale,
                                    layer.fp8_input_scale, bias)
        return y if bias is None else y + bias

    def apply_gated(self, layer, x, bias):
        if self._dense_blocks(layer) and bias is None and envs.fused_glu():
            sizes = layer.output_partition_sizes
            if len(sizes) == 2 and sizes[0] == sizes[1]:
                return self._block_apply(layer, x, glu=True)
        if not layer.fp8_runs:
            return None
        y = fp8_linear.gated_gemv(layer, x, layer.weight_fp8, layer.weight_scale, bias)
        if y is None and fp8_linear.unit_gated_applies(
                layer, x.reshape(-1, x.shape[-1]), layer.weight_fp8, layer.weight_scale, bias):
            y = scaled_mm_linear(x, layer.weight_fp8, layer.weight_scale,
                                 layer.fp8_input_scale, glu=True)
        return y

    def apply_qkv_rope(self, layer, x, bias, positions, cos_sin_cache, kv_store):
        if not layer.fp8_runs:
            return None
        return fp8_linear.qkv_rope_gemv(layer, x, layer.weight_fp8, layer.weight_scale, bias,
                                        positions, cos_sin_cache, kv_store)

    def dense_weight(self, layer):
        # With FP8 activation groups the layer is not ``x W^T``: no oneDNN shortcut.
        return None if self.act_group else getattr(layer, "dequantized_weight", None)


class Fp8Config(QuantizationConfig):
    """``quantization_config``: quant_method "fp8", activation_scheme ("dynamic" or
    "static"), weight_block_size ([128, 128] or absent), ignored_layers /
    modules_to_not_convert; ``{}`` (quantize at load) uses the name's granularity."""

    name = "fp8"
    per_channel = False

    def __init__(self, prequantized: bool = False, block: tuple[int, int] | None = None,
                 static_input: bool = False, ignore=()) -> None:
        super().__init__(ignore)
        self.prequantized, self.block, self.static_input = prequantized, block, static_input

    @classmethod
    def reads_checkpoint(cls, quant_method: str) -> bool:
        return quant_method == "fp8"

    @classmethod
    def from_config(cls, config):
        if not config:
            return cls()
        scheme = str(config.get("activation_scheme", "dynamic")).lower()
        if scheme not in ("dynamic", "static"):
            raise ValueError(f"fp8 activation_scheme={scheme!r} is not supported "
                             "(dynamic, static)")
        block = config.get("weight_block_size")
        if block is not None:
            if len(block) != 2 or any(int(b) <= 0 for b in block):
                raise ValueError(f"fp8 weight_block_size={block!r} must be two positive ints")
            block = (int(block[0]), int(block[1]))
        fmt = str(config.get("fmt", "e4m3")).lower()
        if fmt != "e4m3":
            raise ValueError(f"fp8 fmt={fmt!r} is not supported (e4m3)")
        ignore = list(config.get("ignored_layers") or []) + ignored_modules(config)
        return cls(prequantized=True, block=block, static_input=scheme == "static",
                   ignore=ignore)

    def get_linear_method(self, layer, prefix):
        return Fp8LinearMethod(self.per_channel, self.prequantized, self.block,
                               self.static_input)


class Fp8PerChannelConfig(Fp8Config):
    name = "fp8-per-channel"
    per_channel = True
