"""Where a decode step's time goes on the GPU, per kernel class, against the device's limits.

A W1-like decode batch (Qwen3-0.6B shape by default, bf16, dummy weights) runs a few decode
steps under torch.profiler. Every GPU kernel is put in a class (attention, GEMMs, norms /
rotary / activation, KV-cache writes, sampling, copies and other elementwise work); for each
class the script prints its time per step and what that time achieves: for the GEMMs the
weight bytes read (every weight once per step) and the FLOPs, for attention the K/V bytes of
the batch's contexts, both as fractions of the device's HBM bandwidth / tensor-core rate. The
step time itself is measured without the profiler, with CUDA events, and so is the step's
bandwidth bound (weights + K/V bytes at full HBM bandwidth).

    python benchmarks/profile_step.py [--shape qwen3-0.6b] [--batch 128] [--context 1000]
                                      [--steps 16] [--eager] [--quantization w4a16]
                                      [--json out.json]

``--quantization`` takes the weights of ``benchmarks/quantized.py`` (w4a16, w8a16: GPTQ layout,
group 128; fp8), and the GEMMs' bytes are then what the model holds (less the embedding).

``--prefill TOKENS`` profiles prefill steps instead (a W1 / W2 prefill step is 16,384 tokens
of whole prompts): each step runs TOKENS // context fresh prompts of ``--context`` tokens
that end at their first token, so no step decodes; the GEMMs and attention are measured by
their FLOPs (every prompt token through every linear layer, the LM head for each prompt's
last token only, causal attention) against the tensor-core rate, and the bound is those
FLOPs at that rate.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402
from benchmarks.quantized import METHODS as QUANT_METHODS  # noqa: E402
from benchmarks.quantized import weight_bytes as model_weight_bytes  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    SHAPES,
    decode_weight_bytes,
    device_limits,
    prefill_flops,
    routed_expert_bytes,
    shape_cost,
    write_config,
)
from octavo import envs  # noqa: E402

# Kernel name patterns, first match wins (Triton kernels keep their Python names, the GEMVs
# included; cuBLAS / CUTLASS GEMMs carry gemm / xmma / nvjet / cutlass in theirs).
CLASSES = [
    # The fused MoE layer's own kernels (octavo/kernels/fused_moe.py, moe_route.py); the
    # torch routing ops, where they run, fall under sampling / copies by their names.
    ("moe", r"_gate_up_kernel|_down_kernel|route_align|sum_pairs"),
    ("attention", r"paged_attention|split_reduce|attn|flash|streamk|work_list"),
    ("kv_cache_write", r"reshape_and_cache"),
    ("gemm", r"gemm|gemv|swapab|dequantize|xmma|nvjet|cutlass|cublas|sm90_|splitk|s16816|wgmma|"
             r"dense_mma"),
    ("norm_rotary_act", r"rms_norm|rotary|silu|act_and_mul|layer_norm|_norm"),
    ("sampling", r"race|sort|topk|softmax|argmax|exponential|distribution|philox|cumsum|radix|"
                 r"bitonic|max_kernel|reduce_kernel|multinomial"),
    ("copies_elementwise", r"copy|memcpy|memset|fill|index|gather|scatter|cat|elementwise|"
                           r"vectorized|unrolled|where"),
]


def overlap_note(pdl_on: bool, eager: bool, gpu_ms: float, step_ms: float) -> str | None:
    """A warning for a table whose kernels overlapped: under programmatic dependent launch
    (``OCTAVO_PDL``, captured graphs) each kernel starts before the previous one ends, so the
    profiler's per-kernel times add up to more than the step (session 34: "GPU busy" 7.9 ms
    for a 2.56 ms step) and say nothing per class. None where the table holds."""
    if not pdl_on or eager or gpu_ms <= 1.05 * step_ms:
        return None
    return (f"warning: kernels overlapped under programmatic dependent launch (GPU busy "
            f"{gpu_ms:.3f} ms > step {step_ms:.3f} ms): the per-class times below do not add "
            f"up; run with OCTAVO_PDL=0 for a per-kernel table")


def classify(name: str) -> str:
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


def kernel_times(prof) -> dict[str, float]:
    """Kernel name -> total device microseconds, from the profiler's GPU events."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    out: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if getattr(ev, "device_type", None) != cuda:
            continue
        us = getattr(ev, "device_time", None)
        if us is None:
            us = getattr(ev, "cuda_time", 0.0)
        out[ev.name] += float(us)
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--context", type=int, default=1000,
                    help="prompt tokens per request (W1's decode contexts run 500-2000)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--prefill", type=int, default=0, metavar="TOKENS",
                    help="profile prefill steps of TOKENS prompt tokens instead of decodes")
    ap.add_argument("--quantization", default="bf16", choices=sorted(QUANT_METHODS),
                    help="weights as benchmarks/quantized.py makes them (dummy values)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.prefill:
        if not 1 <= args.context <= args.prefill:
            ap.error(f"--context must be 1..--prefill ({args.prefill}), got {args.context}")
        args.batch = args.prefill // args.context  # prompts per step
    import torch
    from torch.profiler import ProfilerActivity, profile

    from octavo import LLM, SamplingParams

    qcfg, quantization = QUANT_METHODS[args.quantization]
    folder = write_config(args.shape, **({} if qcfg is None else {"quantization_config": qcfg}))
    llm = LLM(model=folder, quantization=quantization, load_format="dummy", dtype="bfloat16",
              skip_tokenizer_init=True, max_model_len=max(4096, args.context + 64),
              # Prefill: room for the next step's prompts while the step in flight still
              # holds its requests' sequence slots (asynchronous scheduling).
              max_num_seqs=max(args.batch, 1) * (2 if args.prefill else 1),
              max_num_batched_tokens=args.prefill or 16384, enforce_eager=args.eager,
              enable_prefix_caching=not args.prefill)
    engine = llm.llm_engine
    if args.prefill:
        # Whole prompts that finish at their first token: every step is prefill only. Two
        # warm-up steps, then the timed and the profiled steps.
        params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=1)
        for i in range(args.batch * (2 * args.steps + 2)):
            engine.add_request(str(i), {"prompt_token_ids": [i % 1000 + 1] * args.context},
                               params)
        for _ in range(2):
            engine.step()
    else:
        params = SamplingParams(temperature=0.6, ignore_eos=True,
                                max_tokens=3 * args.steps + 16)
        for i in range(args.batch):
            engine.add_request(str(i), {"prompt_token_ids": [i % 1000 + 1] * args.context},
                               params)
        while engine.timings.decode_steps < 4:  # prefill, then a few decodes to warm up
            engine.step()

    # The step time without the profiler (CUDA events around whole steps).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    tokens0 = engine.timings.tokens
    start.record()
    for _ in range(args.steps):
        engine.step()
    end.record()
    torch.cuda.synchronize()

    def model_steps(tokens: int) -> float:
        # Prefill: engine.step() calls need not all be model steps (with asynchronous
        # scheduling a call that can schedule nothing only finishes the step in flight), so
        # count steps by the tokens scheduled; a decode call is one step of the batch.
        if not args.prefill:
            return args.steps
        if tokens <= 0:
            raise SystemExit("no prefill step ran in the measured window")
        return tokens / (args.batch * args.context)

    timed_steps = model_steps(engine.timings.tokens - tokens0)
    step_ms = start.elapsed_time(end) / timed_steps
    mean_context = args.context + (0 if args.prefill
                                   else engine.timings.decode_steps + args.steps // 2)

    tokens0 = engine.timings.tokens
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    profiled_steps = model_steps(engine.timings.tokens - tokens0)
    while engine.has_unfinished_requests():
        engine.step()

    per_kernel = kernel_times(prof)
    by_class: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for name, us in per_kernel.items():
        by_class[classify(name)] += us / profiled_steps
    for ev in prof.events():
        if getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA:
            launches[classify(ev.name)] += 1
    gpu_us = sum(by_class.values())

    bandwidth, flops, limits = device_limits()
    cost = shape_cost(args.shape)
    weight_bytes = decode_weight_bytes(args.shape, args.batch)  # a MoE's routed experts only
    # A MoE's experts are the moe class's bytes when its kernels ran (else the loop's GEMMs).
    moe_bytes = routed_expert_bytes(args.shape, args.batch) if by_class.get("moe") else 0.0
    dense_bytes = weight_bytes - moe_bytes  # what the gemm class reads
    if args.quantization != "bf16":  # what the model holds, less the embedding table
        weight_bytes = model_weight_bytes(engine.executor.worker.runner.model, per_step=True)
    if args.prefill:  # bound by FLOPs
        gemm_flops, attn_flops = prefill_flops(args.shape, args.batch, args.context)
        bound_ms = 1e3 * (gemm_flops + attn_flops) / flops
    else:  # bound by bytes: the weights once and the contexts' K/V
        attn_flops = None
        kv_bytes = args.batch * mean_context * cost.kv_bytes_per_token
        gemm_flops = args.batch * cost.flops_per_token
        bound_ms = 1e3 * (weight_bytes + kv_bytes) / bandwidth

    def frac_bw(nbytes: float, us: float) -> float | None:
        return None if us <= 0 else nbytes / (us * 1e-6) / bandwidth

    rows = []
    for cls in [c for c, _ in CLASSES] + ["other"]:
        us = by_class.get(cls, 0.0)
        row = {"class": cls, "us_per_step": round(us, 1),
               "share_of_gpu_time": round(us / gpu_us, 3) if gpu_us else None,
               "launches_per_step": round(launches.get(cls, 0) / profiled_steps, 1)}
        if cls == "moe" and moe_bytes and not args.prefill:
            row["bytes_per_step"] = moe_bytes
            row["hbm_fraction"] = frac_bw(moe_bytes, us)
        if cls == "gemm":
            row["flops_per_step"] = gemm_flops
            if not args.prefill:  # a prefill step's GEMMs are bound by FLOPs, not bytes
                row["bytes_per_step"] = dense_bytes
                row["hbm_fraction"] = frac_bw(dense_bytes, us)
            row["tensor_fraction"] = None if us <= 0 else gemm_flops / (us * 1e-6) / flops
        elif cls == "attention" and attn_flops is not None:
            row["flops_per_step"] = attn_flops
            row["tensor_fraction"] = None if us <= 0 else attn_flops / (us * 1e-6) / flops
        elif cls == "attention":
            row["bytes_per_step"] = kv_bytes
            row["hbm_fraction"] = frac_bw(kv_bytes, us)
        rows.append(row)

    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:15]
    pdl_on = envs.pdl()
    result = {
        "benchmark": "profile_step", "mode": "prefill" if args.prefill else "decode",
        "shape": args.shape, "quantization": args.quantization, "batch": args.batch,
        "context": args.context, "mean_context": mean_context, "eager": args.eager,
        "device": device_info(), "limits": limits, "commit": git_commit(),
        "step_calls": args.steps, "model_steps_timed": timed_steps,
        "model_steps_profiled": profiled_steps,
        "step_ms": round(step_ms, 3), "gpu_busy_ms_per_step": round(gpu_us / 1e3, 3),
        "bound_ms": round(bound_ms, 3), "fraction_of_bound": round(bound_ms / step_ms, 3),
        "kernel_launches_per_step": round(sum(launches.values()) / profiled_steps, 1),
        "pdl": pdl_on,
        "classes": rows,
        "top_kernels": [{"name": n[:90], "class": classify(n),
                         "us_per_step": round(us / profiled_steps, 1)} for n, us in top],
    }
    what = (f"prefill of {args.batch} prompts x {args.context} tokens" if args.prefill
            else f"batch {args.batch} context ~{mean_context}")
    print(f"{args.shape} {args.quantization} {what} ({'eager' if args.eager else 'CUDA graphs'}) on {limits}")
    print(f"step {step_ms:.3f} ms (no profiler); GPU busy {gpu_us / 1e3:.3f} ms; "
          f"{'FLOP' if args.prefill else 'bandwidth'} bound {bound_ms:.3f} ms = "
          f"{bound_ms / step_ms:.1%} of the step; "
          f"{result['kernel_launches_per_step']} kernels per step; {timed_steps:g} / "
          f"{profiled_steps:g} model steps in {args.steps} engine.step() calls (timed / "
          f"profiled)")
    note = overlap_note(pdl_on, args.eager, gpu_us / 1e3, step_ms)
    if note:
        print(note)
    print(f"{'class':<20}{'us/step':>10}{'share':>8}{'launch':>8}{'HBM':>8}{'tensor':>8}")
    for r in rows:
        hbm = r.get("hbm_fraction")
        ten = r.get("tensor_fraction")
        print(f"{r['class']:<20}{r['us_per_step']:>10.1f}"
              f"{(r['share_of_gpu_time'] or 0):>8.1%}{r['launches_per_step']:>8.1f}"
              f"{'' if hbm is None else f'{hbm:.1%}':>8}{'' if ten is None else f'{ten:.1%}':>8}")
    print("top kernels:")
    for k in result["top_kernels"]:
        print(f"  {k['us_per_step']:>8.1f} us  {k['class']:<18} {k['name']}")
    print_json_result(result, args.json)


if __name__ == "__main__":
    main()
