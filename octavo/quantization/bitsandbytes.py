"""bitsandbytes: weight-only 8-bit (LLM.int8's weights) and 4-bit NF4 / FP4, quantized at load
from a float checkpoint or read from a checkpoint transformers saved with a
``BitsAndBytesConfig`` (formats in ``bnb_format``).

Names (``quantization=``):

- ``"bitsandbytes"``: 8-bit at load (per-output-row absmax int8, as the seed's 8-bit line);
  on a pre-quantized checkpoint, whatever it holds (8-bit or 4-bit).
- ``"bitsandbytes-nf4"``: 4-bit NF4 at load, blocks of 64, double quantization on (what
  transformers users write as ``load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_use_double_quant=True``; vLLM's in-flight bitsandbytes is 4-bit too).
- ``"bitsandbytes-fp4"``: 4-bit FP4 at load, blocks of 64, no double quantization
  (transformers' defaults for ``load_in_4bit=True``).

Compute is weight-only: 8-bit multiplies float activations by ``q * SCB / 127`` (bitsandbytes'
``Linear8bitLt`` instead quantizes activations to int8 per row with fp16 outlier columns above
``llm_int8_threshold``; Octavo does not). 4-bit matches bitsandbytes: dequantize (float32
products) to the compute dtype, then matmul.

- CPU: each layer's weight is dequantized once at load to the model dtype (oneDNN packs it).
- CUDA: 8-bit stays int8, through the W8A16 Triton GEMM (``w4a16_gemm``, one group over K,
  zero point 128) where it runs, else ``(x @ q^T) * scale``; 4-bit stays packed: decode
  rows (1-2) run the fused GEMV of ``octavo.kernels.bnb4_gemv`` (one gather per byte from a
  256-entry table of code pairs, each word's sum times its block's absmax, float32),
  larger batches dequantize in one launch (the same values, rounded to the activations'
  dtype) and run cuBLAS.

Checkpoint tensor names ``<layer>.weight.absmax`` (etc.) become parameters ``weight_absmax``
through ``checkpoint_tensors``; each merged part (q/k/v, gate/up) is decoded on its own, as
transformers quantized each projection on its own, then narrowed for tensor parallelism.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.kernels import w4a16_gemm as kern
from octavo.kernels.triton_utils import HAS_TRITON
from octavo.quantization import bnb_format as fmt
from octavo.quantization.base import LinearMethod, QuantizationConfig, ignored_modules
from octavo.quantization.bnb_weight import (
    Blocks4bit,
    Dense,
    Int8Rows,
    blocks_or_dense,
    byte_table,
    concat,
    dequantize_packed,
)
from octavo.quantization.merged_parts import part_order, rank_box
from octavo.quantization.module_match import checkpoint_modules

# Checkpoint suffixes of a Linear4bit's weight -> our parameter names.
_4BIT_SUFFIXES = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
_QUANT_STATE = ".weight.quant_state.bitsandbytes__"
_MIXTRAL_EXPERT = re.compile(r"\.experts\.(\d+)\.(w[123])$")
_MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def keeps_quantized(device: torch.device) -> bool:
    """Whether layers on ``device`` keep int8 / 4-bit weights (else dense at load)."""
    return device.type == "cuda"


def kernels_run(x: torch.Tensor) -> bool:
    """Whether packed 4-bit layers run ``octavo.kernels.bnb4_gemv`` on ``x``: CUDA, or the
    CPU under Triton's interpreter (the tests of the CUDA layout)."""
    from octavo.kernels.triton_utils import interpreting

    return HAS_TRITON and (x.is_cuda or interpreting())


def _decode_gemv(layer: nn.Module, x2: torch.Tensor, bs: int) -> torch.Tensor | None:
    """A packed 4-bit layer's small batches through the CUDA C++ GEMV (``bnb4_cuda``,
    OCTAVO_BNB4_CUDA: up to OCTAVO_BNB4_CUDA_MAX_M rows, 8 by default, a launch per 4) where
    it takes the call, else decode rows (1-2) through the Triton one (``bnb4_gemv``,
    OCTAVO_BNB4_GEMV); None for the batches neither takes. (``qweight`` is 16-byte aligned
    since the load, its rows K / 2 bytes apart.)"""
    from octavo.kernels import bnb4_cuda
    from octavo.kernels import bnb4_gemv as kernels

    m, k = x2.shape
    if x2.is_cuda and bnb4_cuda.supported(m, k, bs, x2.dtype) and bnb4_cuda.available(
            x2.device):
        return bnb4_cuda.bnb4_gemv_cuda(x2, layer.qweight, layer.absmax, layer.code, bs)
    if envs.bnb4_gemv() and kernels.supported(m, k, bs):
        table = layer.code if envs.bnb4_table() == 16 else layer.code_pairs
        return kernels.bnb4_gemv(x2, layer.qweight, layer.absmax, table, bs)
    return None


def _fused_gemm(layer: nn.Module, x2: torch.Tensor, bs: int) -> torch.Tensor | None:
    """Batches past the GEMVs, up to OCTAVO_BNB4_GEMM_MAX_M rows (16 by default: it lost
    at 64 on an H100), through the fused tensor-core GEMM (``bnb4_gemm``, codes decoded by selects);
    None where it does not take the call (the caller dequantizes, then cuBLAS)."""
    m, k = x2.shape
    if m > envs.bnb4_gemm_max_m():
        return None
    from octavo.kernels import bnb4_gemm

    if not bnb4_gemm.supported(m, k, bs):
        return None
    return bnb4_gemm.bnb4_gemm(x2, layer.qweight, layer.absmax, layer.code_values, bs)


def use_int8_kernel(device: torch.device, k: int) -> bool:
    return device.type == "cuda" and HAS_TRITON and kern.kernel_supports(k, k, 8)


class BitsAndBytesLinearMethod(LinearMethod):
    """``bits`` 8 or 4; ``prequantized``: the checkpoint holds bitsandbytes tensors, else a
    float weight quantized here as it is loaded (each part as soon as it arrives)."""

    def __init__(self, bits: int, quant_type: str, double_quant: bool, blocksize: int,
                 prequantized: bool) -> None:
        self.bits, self.quant_type = bits, quant_type
        self.double_quant, self.blocksize = double_quant, blocksize
        self.prequantized = prequantized

    def checkpoint_params(self) -> dict[str, torch.dtype | None]:
        """Our parameter names and their checkpoint dtypes (None: the model's float dtype)."""
        if not self.prequantized:
            return {"weight": None}
        if self.bits == 8:
            return {"weight": torch.int8, "SCB": torch.float32}
        names = {"weight": torch.uint8, "weight_quant_map": torch.float32,
                 "weight_quant_state": torch.uint8,
                 "weight_absmax": torch.uint8 if self.double_quant else torch.float32}
        if self.double_quant:
            names.update(weight_nested_absmax=torch.float32,
                         weight_nested_quant_map=torch.float32)
        return names

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.params_dtype = params_dtype
        layer.bnb_parts = {}
        for name, dtype in self.checkpoint_params().items():
            # A placeholder: each checkpoint part is decoded (or quantized) as it arrives.
            p = nn.Parameter(torch.empty(0, dtype=dtype or params_dtype), requires_grad=False)
            p.weight_loader = functools.partial(self._receive, layer, name)
            layer.register_parameter(name, p)

    # Loading ------------------------------------------------------------------------------

    def _receive(self, layer, name, param, loaded, shard_id=None) -> None:
        part = layer.bnb_parts.setdefault(shard_id, {})
        if name in part:
            raise ValueError(f"layer {layer.prefix!r}: {name} of part {shard_id!r} loaded twice")
        loaded = loaded.to(param.device)
        if self.prequantized:
            part[name] = loaded
            return
        # Narrow the float weight to this rank first: each rank quantizes its own slice.
        part["decoded"] = self._quantize(self._narrow(layer, shard_id, Dense(loaded)).w)
        part[name] = True

    def _quantize(self, w: torch.Tensor) -> Int8Rows | Blocks4bit | Dense:
        if self.bits == 8:
            # As bitsandbytes' Int8Params: the weight rounded to float16 first (a no-op for
            # bf16 / fp16 checkpoints; on float32 ones ~0.5% of the int8 values move a step).
            w16 = w.clamp(-65504.0, 65504.0).half().to(w.dtype)
            return Int8Rows(*fmt.quantize_int8_rows(w16))
        rows, cols = w.shape
        packed, absmax = fmt.quantize_4bit(w, self.quant_type, self.blocksize)
        if self.double_quant:
            q, nested_absmax, offset = fmt.double_quantize(absmax)
            absmax = fmt.undo_double_quant(q, nested_absmax, fmt.dynamic_map(w.device),
                                           fmt.NESTED_BLOCKSIZE, offset)
        return blocks_or_dense(packed, absmax, fmt.code_table(self.quant_type, w.device),
                               self.blocksize, rows, cols)

    def _decode(self, layer, shard_id, part: dict):
        missing = [n for n in self.checkpoint_params() if n not in part]
        if missing:
            raise ValueError(f"layer {layer.prefix!r}: part {shard_id!r} lacks {missing}")
        if self.bits == 8:
            return Int8Rows(part["weight"], part["SCB"].float())
        state = fmt.parse_quant_state(part["weight_quant_state"])
        if state.get("quant_type") != self.quant_type:
            raise ValueError(f"layer {layer.prefix!r}: the checkpoint's quant_state says "
                             f"{state.get('quant_type')!r}, its config {self.quant_type!r}")
        rows, cols = (int(s) for s in state["shape"])
        absmax = part["weight_absmax"]
        if "nested_offset" in state:
            absmax = fmt.undo_double_quant(absmax, part["weight_nested_absmax"],
                                           part["weight_nested_quant_map"],
                                           int(state["nested_blocksize"]),
                                           float(state["nested_offset"]))
        elif absmax.dim() == 2:
            # transformers 5 saves a float absmax as [cols / blocksize, rows] (row r's blocks
            # in column r); 1-D is the flat block order.
            absmax = absmax.t()
        return blocks_or_dense(part["weight"], absmax.reshape(-1), part["weight_quant_map"],
                               int(state["blocksize"]), rows, cols)

    @staticmethod
    def _narrow(layer, shard_id, w):
        """This rank's rows and columns of one part (from the part's full checkpoint shape)."""
        box = rank_box(layer, shard_id, *w.shape)
        return w if box == (0, w.shape[0], 0, w.shape[1]) else w.narrow(*box)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        parts = layer.bnb_parts
        del layer.bnb_parts
        names = list(self.checkpoint_params())
        device = getattr(layer, names[0]).device
        for name in names:
            delattr(layer, name)
        if not parts:  # load_format="dummy": random weights, quantized
            w = torch.empty(layer.output_size_per_partition, layer.input_size_per_partition,
                            device=device).uniform_(-1e-3, 1e-3)
            parts = {None: {"decoded": self._quantize(w)}}
        decoded = []
        for sid in part_order(layer, parts):
            part = parts[sid]
            if "decoded" in part:
                decoded.append(part["decoded"])
            else:
                decoded.append(self._narrow(layer, sid, self._decode(layer, sid, part)))
        weight = concat(decoded)
        expect = (layer.output_size_per_partition, layer.input_size_per_partition)
        if tuple(weight.shape) != expect:
            raise ValueError(f"layer {layer.prefix!r}: the checkpoint's parts make a "
                             f"{tuple(weight.shape)} weight, the layer needs {expect}")
        self._finish(layer, weight, device)

    def _finish(self, layer, weight, device) -> None:
        layer.bnb_kind = "dense"
        if keeps_quantized(device) and isinstance(weight, Int8Rows):
            k = weight.q.shape[1]
            scale = (weight.scb * fmt.INV_127).float()
            if use_int8_kernel(device, k):
                q = (weight.q.to(torch.int32) + 128).t()  # [k, n], 0..255 around zero 128
                layer.register_buffer("qweight_kernel", kern.pack_along_k(q, 8),
                                      persistent=False)
                layer.register_buffer("scales_kernel", scale[None].contiguous(),
                                      persistent=False)
                layer.register_buffer("zeros_kernel", torch.full_like(scale[None], 128.0),
                                      persistent=False)
                layer.bnb_kind = "int8_kernel"
            else:
                layer.register_buffer("qweight", weight.q.contiguous(), persistent=False)
                layer.register_buffer("weight_scale", scale, persistent=False)
                layer.bnb_kind = "int8"
            return
        if keeps_quantized(device) and isinstance(weight, Blocks4bit):
            packed = weight.packed.contiguous()
            if packed.data_ptr() % 16:  # a view into a checkpoint's bytes: the GEMV reads words
                packed = packed.clone()
            layer.register_buffer("qweight", packed, persistent=False)
            layer.register_buffer("absmax", weight.absmax.contiguous(), persistent=False)
            layer.register_buffer("code_pairs", byte_table(weight.code), persistent=False)
            layer.register_buffer("code", weight.code.float().contiguous(), persistent=False)
            layer.code_values = tuple(layer.code.tolist())  # the select-tree dequantizer's
            layer.bnb_blocksize = weight.blocksize
            layer.bnb_kind = "4bit"
            return
        layer.register_buffer("dequantized_weight", weight.dense().to(self.params_dtype),
                              persistent=False)

    # Compute ------------------------------------------------------------------------------

    def apply(self, layer, x, bias):
        kind = layer.bnb_kind
        if kind == "dense":
            w = layer.dequantized_weight
            return F.linear(x, w if w.dtype == x.dtype else w.to(x.dtype), bias)
        if kind == "int8_kernel":
            y = kern.w4a16_gemm(x, layer.qweight_kernel, layer.scales_kernel,
                                layer.zeros_kernel, x.shape[-1], 8)
        elif kind == "int8":
            # The scale is per output row: apply it after the matmul (ints are exact in bf16).
            y = F.linear(x, layer.qweight.to(x.dtype)) * layer.weight_scale.to(x.dtype)
        else:
            return self._apply_4bit(layer, x, bias)
        return y if bias is None else y + bias

    @staticmethod
    def _apply_4bit(layer, x, bias):
        """Packed 4-bit weights on CUDA: decode rows through a fused GEMV (``_decode_gemv``),
        larger batches dequantized in one launch, then cuBLAS; elsewhere the torch
        dequantization."""
        x2 = x.reshape(-1, x.shape[-1])
        bs = layer.bnb_blocksize
        if kernels_run(x):
            from octavo.kernels import bnb4_gemv as kernels

            y = _decode_gemv(layer, x2, bs)
            if y is None:
                y = _fused_gemm(layer, x2, bs)
            if y is not None:
                y = y.view(*x.shape[:-1], y.shape[-1])
                return y if bias is None else y + bias
            if envs.bnb4_dequant() == "select":
                w = kernels.dequantize_4bit_select(layer.qweight, layer.absmax,
                                                   layer.code_values, bs, x.dtype)
            else:
                w = kernels.dequantize_4bit(layer.qweight, layer.absmax, layer.code_pairs, bs,
                                            x.dtype)
            return F.linear(x, w, bias)
        w = dequantize_packed(layer.qweight, layer.absmax, None, bs, x.dtype,
                              table=layer.code_pairs)
        return F.linear(x, w, bias)

    def dense_weight(self, layer):
        return getattr(layer, "dequantized_weight", None)


class BitsAndBytesConfig(QuantizationConfig):
    """``quantization_config`` as transformers writes it: load_in_8bit / load_in_4bit,
    bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_quant_storage,
    llm_int8_skip_modules; ``{}`` (quantize at load) takes the name's preset."""

    name = "bitsandbytes"
    # The preset of quantize-at-load: (bits, quant_type, double_quant).
    online = (8, "nf4", False)

    def __init__(self, bits: int = 8, quant_type: str = "nf4", double_quant: bool = False,
                 blocksize: int = 64, prequantized: bool = False, ignore=()) -> None:
        super().__init__(ignore)
        if bits not in (4, 8):
            raise ValueError(f"bitsandbytes bits={bits} is not supported (4 or 8)")
        if bits == 4:
            fmt.code_table(quant_type)  # validates the type
        self.bits, self.quant_type, self.double_quant = bits, quant_type, double_quant
        self.blocksize, self.prequantized = blocksize, prequantized
        # A pre-quantized checkpoint's quantized modules, from its tensor names (None: not
        # known, every layer the config does not skip is taken as quantized).
        self._stored_quantized: set[str] | None = None

    @classmethod
    def reads_checkpoint(cls, quant_method: str) -> bool:
        return quant_method == "bitsandbytes"

    @classmethod
    def from_config(cls, config):
        if not config:
            bits, quant_type, double_quant = cls.online
            return cls(bits, quant_type, double_quant)
        four = bool(config.get("load_in_4bit") or config.get("_load_in_4bit"))
        eight = bool(config.get("load_in_8bit") or config.get("_load_in_8bit"))
        if four == eight:
            raise ValueError("a bitsandbytes checkpoint's quantization_config must set exactly "
                             f"one of load_in_4bit / load_in_8bit: {config}")
        bits = 4 if four else 8
        quant_type = str(config.get("bnb_4bit_quant_type") or "fp4").lower()
        double_quant = bool(config.get("bnb_4bit_use_double_quant", False))
        storage = str(config.get("bnb_4bit_quant_storage") or "uint8").replace("torch.", "")
        if bits == 4 and storage != "uint8":
            raise ValueError(f"bitsandbytes bnb_4bit_quant_storage={storage!r} is not "
                             "supported (uint8 only)")
        if cls.name != "bitsandbytes" and (bits, quant_type) != cls.online[:2]:
            want = f"{cls.online[0]}-bit {cls.online[1]}"
            raise ValueError(f"quantization={cls.name!r} asks for {want}, but the checkpoint "
                             f"holds {bits}-bit" + (f" {quant_type}" if bits == 4 else "")
                             + "; use quantization='bitsandbytes' or leave it unset")
        ignore = list(config.get("llm_int8_skip_modules") or []) + ignored_modules(config)
        return cls(bits, quant_type, double_quant, prequantized=True, ignore=ignore)

    def bind_checkpoint_names(self, names):
        """Which modules a pre-quantized checkpoint holds quantized: those stored with
        bitsandbytes' state (``.SCB``, ``.weight.absmax``, ``.weight.quant_state...``).
        transformers quantizes nn.Linear modules only: in transformers 5 a mixture of
        experts' experts are 3-D parameters, stored float, while Qwen2-MoE's
        ``shared_expert_gate`` (a linear) is quantized; checkpoints written when experts
        were linears (transformers 4) hold them quantized. The names say which."""
        if names is None or not self.prequantized:
            return
        found = set()
        for n in names:
            if n.endswith(".SCB"):
                found.add(n[:-len(".SCB")])
            elif n.endswith(".weight.absmax") or _QUANT_STATE in n:
                found.add(n[:n.index(".weight.")])
        # Mixtral's original expert names, as our layers' checkpoint modules call them.
        self._stored_quantized = {_MIXTRAL_EXPERT.sub(
            lambda m: f".experts.{m.group(1)}.{_MIXTRAL_NAMES[m.group(2)]}", n) for n in found}
        self.quantizes_routers = True  # the names say whether they are

    def _stored(self, prefix: str) -> bool | None:
        """Whether the checkpoint holds the layer at ``prefix`` quantized (None: not known)."""
        if self._stored_quantized is None:
            return None
        parts = checkpoint_modules(prefix, self.packed_modules_mapping)
        stored = [p in self._stored_quantized for p in parts]
        if any(stored) and not all(stored):
            raise ValueError(f"layer {prefix!r} merges {parts}, which the checkpoint stores "
                             "partly quantized; a merged layer is quantized all or nothing")
        return stored[0]

    def quantizes_experts(self, prefix):
        if self._stored_quantized is not None and not any(
                m.startswith(f"{prefix}.") for m in self._stored_quantized):
            return False
        return super().quantizes_experts(prefix)

    def checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name.endswith(".weight_format"):
                # Linear8bitLt's layout tag: 0 is the row-major int8 we read.
                if int(tensor.reshape(-1)[0]) != 0:
                    raise ValueError(f"{name}: bitsandbytes weight_format "
                                     f"{int(tensor.reshape(-1)[0])} is not supported (0, row)")
                continue
            if _QUANT_STATE in name:
                name = name[:name.index(_QUANT_STATE)] + ".weight_quant_state"
            else:
                for suffix in _4BIT_SUFFIXES:
                    if name.endswith(f".weight.{suffix}"):
                        name = name[:-len(f".weight.{suffix}")] + f".weight_{suffix}"
                        break
            yield name, tensor

    def get_linear_method(self, layer, prefix):
        if self._stored(prefix) is False:  # left in float by the writer
            return None
        return BitsAndBytesLinearMethod(self.bits, self.quant_type, self.double_quant,
                                        self.blocksize, self.prequantized)


class BitsAndBytesNF4Config(BitsAndBytesConfig):
    name = "bitsandbytes-nf4"
    online = (4, "nf4", True)


class BitsAndBytesFP4Config(BitsAndBytesConfig):
    name = "bitsandbytes-fp4"
    online = (4, "fp4", False)
