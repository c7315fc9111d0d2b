"""quantization="gguf": linear layers (and token embeddings) keep a GGUF file's block formats.

Each tensor of a GGUF file has its own type, so the config maps every layer prefix to the type
of its checkpoint tensor(s) (``bind``, from the loader). A layer whose tensor type has no
kernel layout (Q2_K, Q3_K, IQ*, F16 ...) is dequantized at load and runs in full precision;
this is logged once per type. A merged layer (qkv, gate_up) whose parts have different types
(llama.cpp's Q4_K_M files give v another type than q and k in half the layers) stays
quantized as segments, one for each run of parts of one type, each in its own layout; their
outputs follow each other. (Stacked in the widest part's bits instead, with float scales per
16 inputs, Qwen2.5-1.5B's mixed q/k/v read 10 bits a weight where the file has ~5: 30 MB a
decode step of its 1 GB.)

Weights arrive as the file's raw rows (uint8 [out, row_bytes]) through the linear layers'
generic loader (rows are whole, so q/k/v and gate/up land at their output offsets unchanged),
and are repacked after loading (``gguf_blocks``). ``apply`` runs the C++ kernel when it is built
(int16 activations per 32-block, integer dot products; from DEQUANT_GEMM_MIN_ROWS rows on,
float32 through the weight dequantized in L2-sized chunks), else dequantize-then-matmul in
torch.

It is the default for ``.gguf`` files on the CPU when ``dtype`` is left at "auto"
(``DEFAULT_ON_CPU``); ``gguf_dequantize=True`` (EngineArgs, ``--gguf-dequantize``) or an explicit
``dtype`` dequantizes everything at load, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.quantization import gguf_blocks
from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.module_match import checkpoint_modules
from octavo.quantization.param_layout import set_param_layout

logger = logging.getLogger(__name__)

# OCTAVO_CPU_QUANT_ISA -> the kernels' isa argument.
ISA_CODES = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}
# Row-major weights: from this many rows on, the float32 product through the weight dequantized
# 64 rows at a time (gguf_linear_dense: exact, BLAS-fast) beats the row-major integer kernel,
# whose per-block float work grows with the rows. Measured on the 2-core EPYC, one thread
# (2026-11-30, vpdpbusd path): 576x3072 Q4_1 at M = 4 0.28 ms integer / 0.49 dense, M = 8
# 0.53 / 0.63, M = 16 1.08 / 0.92. Interleaved weights on the VNNI kernel stay on the integer
# path at every M: 3072x576 Q4_1, one thread, M = 32 0.68 ms / 1.69 dense, M = 128 2.97 / 5.27
# (2026-12-01). So do they on the AVX2 kernel (Zen 4 with AVX-512 masked, 2 threads, 2026-12-05):
# Qwen2.5-1.5B's 8960x1536 Q4_K at M = 12 / 32 / 128 2.0 / 5.8 / 22.5 ms against 20.3 / 23.8 /
# 41.4 through row-major weights dequantized for BLAS; its 1536x8960 Q6_K 3.0 / 8.0 / 32.8
# against 20.4 / 23.8 / 42.2.
DEQUANT_GEMM_MIN_ROWS = 12


def _kernels(x: torch.Tensor):
    if x.device.type != "cpu":
        return None
    from octavo.kernels import cpu as cpu_kernels

    ops = cpu_kernels.ops_for(x)
    return ops if ops is not None and hasattr(ops, "gguf_linear") else None


def interleave_weights() -> bool:
    """Whether repacked weights take the 16-row interleaved layout: where the AVX-512 VNNI or
    the AVX2 kernel on it is built and not switched off by OCTAVO_CPU_QUANT_ISA (the scalar
    path reads it row by row)."""
    from octavo.kernels import cpu as cpu_kernels

    ops = cpu_kernels.load()
    if ops is None or not hasattr(ops, "quant_isas"):
        return False
    isas, want = ops.quant_isas(), envs.cpu_quant_isa()
    return any(ISA_CODES[name] in isas and want in ("auto", name) for name in ("avx512", "avx2"))


def dense_min_rows(qweight: torch.Tensor, isa: int) -> int:
    """Rows from which the dequantize-then-BLAS kernel runs instead of the integer one."""
    if qweight.dim() == 3 and isa != ISA_CODES["scalar"]:
        return 1 << 62  # interleaved: the VNNI or AVX2 kernel on it at every M
    return DEQUANT_GEMM_MIN_ROWS


def gguf_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor, in_features: int, isa: int | None = None) -> torch.Tensor:
    """x [..., K] times the repacked weight's transpose: [..., N] in x's dtype. ``isa``: the
    kernels' instruction set code, read from OCTAVO_CPU_QUANT_ISA when None."""
    shape = x.shape
    x2 = x.reshape(-1, in_features)
    ops = _kernels(x2)
    if isa is None:
        isa = ISA_CODES[envs.cpu_quant_isa()]
    if ops is not None and x2.shape[0] < dense_min_rows(qweight, isa):
        y = ops.gguf_linear(x2.contiguous(), qweight, scales, mins, in_features, isa)
    elif ops is not None:
        y = ops.gguf_linear_dense(x2.contiguous(), qweight, scales, mins, in_features)
    else:
        y = F.linear(x2, gguf_blocks.dequantize(qweight, scales, mins, in_features, x.dtype))
    return y.view(*shape[:-1], y.shape[-1])


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


# A segment's parameters (segment i > 0: the names with "_i").
SEGMENT_PARAMS = ("qweight", "gguf_scales", "gguf_mins")


class GGUFLinearMethod(LinearMethod):
    """GGUF block formats: raw rows while loading, the kernels' layout after. ``fmt``: the
    layer's format; ``part_formats``: {shard id: format} of a merged layer whose parts differ
    (``fmt`` is then the first part's, for messages)."""

    def __init__(self, fmt: str, part_formats: Mapping | None = None) -> None:
        self.fmt = fmt
        self.part_formats = dict(part_formats) if part_formats else None
        # Each segment's parameter names (qweight, scales, mins), in output order; set at load.
        self.segment_names = [SEGMENT_PARAMS]
        self.isa = ISA_CODES[envs.cpu_quant_isa()]  # read once: os.environ costs per call

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype):
        self.in_features = input_size_per_partition
        if self.part_formats is not None:
            # Parts of different row widths: kept whole per shard until they are stacked.
            self._parts: dict = {}
            raw = _frozen(torch.empty(0, dtype=torch.uint8))
            raw.weight_loader = self._load_part
            layer.register_parameter("weight", raw)
            return
        raw = torch.empty(sum(output_partition_sizes),
                          gguf_blocks.row_bytes(self.fmt, input_size_per_partition),
                          dtype=torch.uint8)
        layer.register_parameter("weight", set_param_layout(_frozen(raw), output_dim=0))

    def _load_part(self, param, loaded: torch.Tensor, shard_id=None) -> None:
        fmt = self.part_formats.get(shard_id)
        if fmt is None:
            raise ValueError(f"GGUF merged layer: unexpected part {shard_id!r} (parts: "
                             f"{sorted(map(str, self.part_formats))})")
        want = gguf_blocks.row_bytes(fmt, self.in_features)
        if loaded.dtype != torch.uint8 or loaded.dim() != 2 or loaded.shape[1] != want:
            raise ValueError(f"GGUF part {shard_id!r} ({fmt}): rows {tuple(loaded.shape)} "
                             f"{loaded.dtype} are not uint8 [rows, {want}]")
        self._parts[shard_id] = loaded.clone()

    def process_weights_after_loading(self, layer):
        if self.part_formats is not None:
            from octavo.quantization.merged_parts import part_order, part_rows

            order = part_order(layer, self.part_formats)
            missing = [sid for sid in order if sid not in self._parts]
            if missing:
                raise ValueError(f"GGUF merged layer {getattr(layer, 'prefix', '')!r}: parts "
                                 f"{missing} never arrived")
            for sid in order:
                if part_rows(layer, sid)[1] != self._parts[sid].shape[0]:
                    raise ValueError(f"GGUF part {sid!r}: {self._parts[sid].shape[0]} rows, "
                                     f"expected {part_rows(layer, sid)[1]}")
            segments = [gguf_blocks.repack_parts(
                [(self._parts.pop(sid), self.part_formats[sid]) for sid in run],
                self.in_features, interleave_weights())
                for run in _runs(order, self.part_formats)]
        else:
            segments = [gguf_blocks.repack(layer.weight.data, self.fmt, self.in_features,
                                           interleave_weights())]
        layer.weight = None
        self.segment_names = [tuple(name + (f"_{i}" if i else "") for name in SEGMENT_PARAMS)
                              for i in range(len(segments))]
        for names, segment in zip(self.segment_names, segments, strict=True):
            for name, t in zip(names, segment, strict=True):
                layer.register_parameter(name, _frozen(t))

    def segments(self, layer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(qweight, scales, mins) of each segment, in output order: one, unless the layer
        merges parts of different types."""
        return [tuple(getattr(layer, name) for name in names) for names in self.segment_names]

    def apply(self, layer, x, bias):
        ys = [gguf_matmul(x, *segment, self.in_features, self.isa)
              for segment in self.segments(layer)]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        return y if bias is None else y + bias




def _runs(order: list, formats: Mapping) -> list[list]:
    """``order``'s shard ids in runs of consecutive ones of one format."""
    runs: list[list] = []
    for sid in order:
        if runs and formats[runs[-1][0]] == formats[sid]:
            runs[-1].append(sid)
        else:
            runs.append([sid])
    return runs


class GGUFConfig(QuantizationConfig):
    name = "gguf"

    def __init__(self, ignore=()) -> None:
        super().__init__(ignore)
        self.tensor_types: dict[str, int] | None = None  # module prefix -> GGML type id
        self.kept: set[str] = set()  # checkpoint tensor names loaded as raw GGUF rows
        self._told: set[str] = set()

    def bind(self, tensor_types: Mapping[str, int]) -> None:
        """The file's tensor types, by HF module prefix ("model.layers.0.self_attn.q_proj")."""
        self.tensor_types = dict(tensor_types)

    def _tell(self, key: str, msg: str, *args) -> None:
        if key not in self._told:
            self._told.add(key)
            logger.info(msg, *args)

    def _formats(self, prefixes: list[str]) -> list[str | None]:
        if self.tensor_types is None:
            raise ValueError("quantization='gguf' reads the tensor types of a .gguf model "
                             "file; this model is not one")
        types = [self.tensor_types.get(p) for p in prefixes]
        return [None if t is None else gguf_blocks.format_name(t) for t in types]

    def get_linear_method(self, layer, prefix):
        tp = getattr(layer, "tp", None)
        if tp is not None and tp.size > 1:
            self._tell("tp", "GGUF layers are dequantized with tensor parallelism (GGUF "
                       "blocks are not split across ranks)")
            return None
        parts = checkpoint_modules(prefix, self.packed_modules_mapping)
        formats = self._formats(parts)
        if None in formats:
            types = sorted({str(self.tensor_types.get(p)) for p in parts})
            self._tell(f"type{types}", "GGUF tensor type(s) %s have no quantized kernel: "
                       "such layers (e.g. %s) are dequantized at load", types, prefix)
            return None
        self.kept.update(f"{p}.weight" for p in parts)
        if len(set(formats)) > 1:
            last = prefix.rpartition(".")[2]
            sids = [sid for _, (frag, sid) in self.packed_modules_mapping.items() if frag == last]
            return GGUFLinearMethod(formats[0], dict(zip(sids, formats, strict=True)))
        return GGUFLinearMethod(formats[0])

    def make_experts(self, prefix: str, num_experts: int, hidden: int, inter: int
                     ) -> nn.Module | None:
        """The experts of the MoE layer at ``prefix`` ("model.layers.0.mlp.experts") kept in
        their blocks, where gate and up share a format with a layout and down has one; None
        (dequantized at load) otherwise."""
        parts = [f"{prefix}.{{}}.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
        gate, up, down = self._formats(parts)
        if gate is None or gate != up or down is None:
            self._tell(f"experts{gate}{up}{down}", "GGUF experts of types %s / %s / %s are "
                       "dequantized at load (e.g. %s)", gate, up, down, prefix)
            return None
        from octavo.quantization.gguf_experts import GGUFExperts

        self.kept.update(f"{name}.weight" for name in parts)
        return GGUFExperts(num_experts, hidden, inter, gate, down, interleave_weights())

    def keep_embeddings_quantized(self, model: nn.Module) -> None:
        """Token embeddings (and an untied LM head) whose GGUF type has a layout keep it:
        modules offering ``keep_gguf_quantized(fmt)`` take the raw rows."""
        for name, module in model.named_modules():
            keep = getattr(module, "keep_gguf_quantized", None)
            if keep is None or getattr(module, "tied_to", None) is not None:
                continue
            fmt = self._formats([name])[0]
            if fmt is not None:
                keep(fmt)
                self.kept.add(f"{name}.weight")


# On since the kernels' activations are int16 per 32-block: the default model's greedy tokens
# match the dequantized float32 path on 30 of the 32 W6 prompts over 128 tokens and perplexity
# on benchmarks/data/perplexity_text.txt within 0.01% (2026-11-30). With int8 activations they
# matched on 1 of 32 (SmolLM2's activations have outlier channels; near-tied logits flip).
DEFAULT_ON_CPU = True


def default_quantization(requested: str | None, *, is_gguf: bool, device_type: str,
                         dtype: str, dequantize: bool, load_format: str) -> str | None:
    """The scheme a model runs with once GGUF's default is applied: ``gguf`` for a .gguf file
    on the CPU unless the user gave a dtype, asked for dequantized weights or dummy ones."""
    if requested == "gguf" and not is_gguf:
        raise ValueError("quantization='gguf' needs a .gguf model file")
    if dequantize:
        if requested == "gguf":
            raise ValueError("gguf_dequantize=True contradicts quantization='gguf'")
        return requested
    if (DEFAULT_ON_CPU and requested is None and is_gguf and device_type == "cpu"
            and dtype == "auto" and load_format != "dummy"):
        return "gguf"
    return requested
