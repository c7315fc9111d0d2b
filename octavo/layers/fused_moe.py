"""A sparse mixture-of-experts MLP: a router picks ``top_k`` of ``num_experts`` SwiGLU experts
per token and the outputs are summed with the routing weights (Mixtral, Qwen3-MoE; Qwen2-MoE
adds a gated shared expert).

The experts' weights are stacked, ``w13`` [E, 2 I, H] (gate rows, then up rows) and ``w2``
[E, H, I], so one grouped kernel can run every expert: on CUDA under ``OCTAVO_FUSED_MOE=1``
(the default), ``octavo.kernels.fused_moe``, whose buffers depend only on the batch size, so
decode steps are captured in CUDA graphs. Quantized experts stacked at load
(``QuantizedExperts.stacked``) run the same way: weight-only integer ones through
``octavo.kernels.fused_moe_int``, ones dequantized at load through ``fused_moe``. Elsewhere
(the CPU, other quantized experts) a loop over the experts that received tokens, which reads
the per-expert counts on the host, so such steps run eagerly. Under tensor parallelism each
rank holds a slice of every expert's intermediate features (the gate/up rows column-parallel, the down columns row-parallel) and
the partial outputs are all-reduced once, after the sum over experts. A quantization scheme
may hold the experts itself (``make_experts``: GGUF blocks on the CPU, with a one-call path
for a single token, ``token_forward``); any other quantization holds each expert as a quantized
MLP of its linear methods (``quantized_experts``), run by the loop unless stacked.

Checkpoints store one tensor per expert and projection (``experts.3.gate_proj.weight``);
for stacked experts :func:`map_expert_name` tells the generic loader where each goes, and the
layer's ``weight_loader`` places it at ``shard_id = (expert, "w1" | "w3" | "w2")``; quantized
experts' tensors (``experts.3.gate_proj.qweight``) reach their own linear layers by name.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from octavo import envs
from octavo.distributed.parallel_state import get_tp_group
from octavo.layers.linear import ReplicatedLinear
from octavo.quantization.base import QuantizationConfig
from octavo.quantization.param_layout import expert_shard, set_expert_shards
from octavo.quantization.unquantized import UnquantizedLinearMethod

_EXPERT_NAME = re.compile(r"\.experts\.(\d+)\.(\w+)\.weight$")
GATE_UP_DOWN = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}  # Qwen-MoE's names


def map_expert_name(name: str, projections: dict[str, str] = GATE_UP_DOWN
                    ) -> tuple[str, tuple[int, str]] | None:
    """The stacked parameter and shard id of a per-expert checkpoint tensor, e.g.
    "model.layers.0.mlp.experts.3.gate_proj.weight" -> ("model.layers.0.mlp.experts.w13_weight",
    (3, "w1")); None for any other name. ``projections``: the checkpoint's projection names
    -> "w1" (gate), "w3" (up), "w2" (down)."""
    m = _EXPERT_NAME.search(name)
    if m is None or m.group(2) not in projections:
        return None
    which = projections[m.group(2)]
    param = "w2_weight" if which == "w2" else "w13_weight"
    return f"{name[:m.start()]}.experts.{param}", (int(m.group(1)), which)


def on_kernel_device(x: torch.Tensor) -> bool:
    """Whether ``x`` is where the grouped kernels run (CUDA; tests point this at Triton's
    CPU interpreter)."""
    return x.is_cuda


def quantizes_experts(quant_config: QuantizationConfig | None, prefix: str) -> bool:
    """Whether the experts at ``prefix`` ("model.layers.0.mlp.experts") are held per expert
    by the scheme's linear methods (``QuantizedExperts``): any scheme but none / unquantized /
    GGUF (whose experts keep their blocks through ``make_experts``, or are dequantized at
    load) that says it quantizes them (not where the checkpoint left them out)."""
    if quant_config is None or quant_config.name in ("unquantized", "gguf"):
        return False
    return quant_config.quantizes_experts(prefix)


class FusedMoE(nn.Module):
    """``top_k`` of ``num_experts`` SwiGLU experts per token, weighted by the router."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, quant_config: QuantizationConfig | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"{prefix}: top_k={top_k} must be in [1, num_experts="
                             f"{num_experts}]")
        self.tp = get_tp_group()
        if intermediate_size % self.tp.size:
            raise ValueError(f"{prefix}: expert intermediate size {intermediate_size} is not "
                             f"divisible by tensor_parallel_size={self.tp.size}")
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.prefix = prefix
        inter = intermediate_size // self.tp.size
        self.intermediate_per_partition = inter
        # The router in full precision unless the scheme's checkpoint names it quantized.
        self._router_config = quant_config if getattr(quant_config, "quantizes_routers",
                                                      False) else None
        self.gate = ReplicatedLinear(hidden_size, num_experts, quant_config=self._router_config,
                                     prefix=f"{prefix}.gate")
        self._float_router = isinstance(self.gate.quant_method, UnquantizedLinearMethod)
        # A scheme may hold the experts its own way (GGUF blocks on the CPU: make_experts),
        # or each expert as a quantized MLP of its linear methods; else they are stacked.
        make = getattr(quant_config, "make_experts", None)
        kept = None if make is None or self.tp.size > 1 else make(
            f"{prefix}.experts", num_experts, hidden_size, inter)
        if kept is None and quantizes_experts(quant_config, f"{prefix}.experts"):
            from octavo.layers.quantized_experts import QuantizedExperts

            kept = QuantizedExperts(num_experts, hidden_size, intermediate_size, quant_config,
                                    f"{prefix}.experts")
        self.experts = kept if kept is not None else _Experts(num_experts, hidden_size, inter,
                                                              self.tp)
        # Qwen2-MoE's shared expert, added to every token's output, scaled by
        # sigmoid(shared_expert_gate(x)) (set by the model; its MLP does its own all-reduce).
        self.shared_expert: nn.Module | None = None
        self.shared_expert_gate: nn.Module | None = None

    @property
    def stacked_experts(self) -> bool:
        """Whether the experts are the stacked float weights (``w13_weight`` / ``w2_weight``)
        that the fused kernel runs."""
        return isinstance(self.experts, _Experts)

    def add_shared_expert(self, mlp: nn.Module, hidden_size: int) -> None:
        self.shared_expert = mlp
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1,
                                                   quant_config=self._router_config,
                                                   prefix=f"{self.prefix}.shared_expert_gate")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights [T, k] float32 and expert ids [T, k]: softmax over all experts in
        float32, the top k, renormalised to sum to one where the model says so."""
        probs = torch.softmax(self._logits(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        # F.linear, not the layer's call: on the CPU its oneDNN-packed path took 22 us for
        # a [64, 1024] router at one row against 6.
        return F.linear(x, self.gate.weight) if self._float_router else self.gate(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._routed(x)
        if self.shared_expert is not None:
            y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return y

    @property
    def grouped_experts(self) -> bool:
        """Whether the experts are ones a grouped kernel runs: stacked float experts, or
        quantized experts stacked at load (``QuantizedExperts.stacked``: integer, or float
        weights dequantized at load)."""
        return self.stacked_experts or getattr(self.experts, "stacked", None) is not None

    def _grouped(self, x: torch.Tensor):
        """``(run, block_m)``: the grouped kernel for ``x``'s batch, ``run(x, weights, ids,
        alignment=None)``, and the rows of its tiles; None where the loop runs instead."""
        if not (on_kernel_device(x) and envs.fused_moe() and self.grouped_experts):
            return None
        from octavo.kernels import fused_moe, fused_moe_int

        t, k = x.shape[0], self.top_k
        stacked = None if self.stacked_experts else self.experts.stacked
        if isinstance(stacked, fused_moe_int.IntExperts):
            if not fused_moe_int.supports(x, stacked):
                return None
            return ((lambda x, w, i, alignment=None: fused_moe_int.fused_moe_int(
                x, stacked, w, i, alignment=alignment)),
                fused_moe_int.default_tiles(t, k, stacked).block_m)
        # Float experts: the layer's own stacked weights, or ones stacked at load
        # (``FloatExperts``, or ``Fp8Experts`` with their scales).
        w13, w2 = ((self.experts.w13_weight, self.experts.w2_weight) if stacked is None
                   else (stacked.w13, stacked.w2))
        fp8 = stacked if isinstance(stacked, fused_moe.Fp8Experts) else None
        if not fused_moe.supports(x, w13, w2, fp8):
            return None
        return ((lambda x, w, i, alignment=None: fused_moe.fused_moe(
            x, w13, w2, w, i, alignment=alignment, fp8=fp8)),
            fused_moe.default_tiles(t, k, self.num_experts, x.dtype).block_m)

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        grouped = self._grouped(x)
        if grouped is not None:
            from octavo.kernels import fused_moe as kernel
            from octavo.kernels import moe_route

            run, block_m = grouped
            if moe_route.available(x, x.shape[0] * self.top_k, self.num_experts):
                # Routing and alignment in one launch (decode batches): route() and the
                # rounding below, then the kernel's alignment (moe_route).
                r = moe_route.route_and_align(self._logits(x), self.top_k, self.renormalize,
                                              block_m, round_to=x.dtype)
                align = kernel.Alignment(r.sorted_ids, r.tile_experts)
                return self.tp.all_reduce(run(x, r.weights, r.ids, alignment=align))
        weights, ids = self.route(x)
        # The weights are rounded to the activations' dtype before use, as transformers does.
        weights = weights.to(x.dtype).float()
        token = getattr(self.experts, "token_forward", None)
        if token is not None and x.shape[0] == 1:
            y = token(x, ids[0].tolist(), weights[0].tolist())
            if y is not None:
                return self.tp.all_reduce(y)
        if grouped is not None:
            return self.tp.all_reduce(grouped[0](x, weights, ids))
        return self.tp.all_reduce(_experts_loop(x, weights, ids, self.experts.num_experts,
                                                self.experts.expert_forward))


class _Experts(nn.Module):
    """The stacked expert weights and their loader."""

    def __init__(self, num_experts: int, hidden: int, inter: int, tp) -> None:
        super().__init__()
        self.tp = tp
        self.inter = inter
        self.num_experts = num_experts
        dtype = torch.get_default_dtype()
        for name, shape in (("w13_weight", (num_experts, 2 * inter, hidden)),
                            ("w2_weight", (num_experts, hidden, inter))):
            param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            param.weight_loader = self.weight_loader
            self.register_parameter(name, set_expert_shards(param, name, num_experts))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        expert, which = expert_shard(shard_id, self.num_experts)
        inter, rank = self.inter, self.tp.rank
        if which in ("w1", "w3"):  # [I, H]: this rank's intermediate rows
            target = param.data[expert].narrow(0, 0 if which == "w1" else inter, inter)
            dim = 0
        elif which == "w2":  # [H, I]: this rank's intermediate columns
            target = param.data[expert]
            dim = 1
        else:
            raise ValueError(f"unknown expert projection {which!r}")
        if loaded.shape[dim] != inter * self.tp.size:
            raise ValueError(f"expert {expert} {which}: checkpoint shape {tuple(loaded.shape)} "
                             f"does not fit {inter * self.tp.size} intermediate features")
        loaded = loaded.narrow(dim, rank * inter, inter)
        if target.shape != loaded.shape:
            raise ValueError(f"expert {expert} {which}: shape mismatch, parameter "
                             f"{tuple(target.shape)} vs checkpoint {tuple(loaded.shape)}")
        target.copy_(loaded)

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on rows ``x``: down(silu(gate x) * up x)."""
        gate_up = F.linear(x, self.w13_weight[e])
        return F.linear(F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:],
                        self.w2_weight[e])


def _experts_loop(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  num_experts: int, expert_forward) -> torch.Tensor:
    """The eager path: each expert that received tokens runs once on its rows
    (``expert_forward(e, rows of x)``). Syncs with the host (the per-expert counts), so it is
    not for captured CUDA graphs."""
    if x.shape[0] == 1:  # one token (batch-1 decode): its k experts in order, no sorting
        out = None
        for e, w in zip(ids[0].tolist(), weights[0].unbind(), strict=True):
            y = expert_forward(e, x).float() * w
            out = y if out is None else out + y
        return out.to(x.dtype)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        slots = order[start:start + n]
        start += n
        rows = slots // ids.shape[1]
        y = expert_forward(e, x[rows]).float() * weights.reshape(-1)[slots, None]
        out.index_add_(0, rows, y)
    return out.to(x.dtype)
