"""W1 / W2 offline throughput (../shared/BENCHMARKS.md): Octavo, and optionally the
transformers static-batching peer, in the same call.

    python benchmarks/throughput.py --workload W1            # Qwen3-0.6B shape
    python benchmarks/throughput.py --workload W2            # Llama-3.1-8B shape
    python benchmarks/throughput.py --workload W1 --peers    # + HF generate (slow: minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workloads import (  # noqa: E402
    SHAPES,
    decode_bound_seconds,
    device_limits,
    shape_cost,
    w1_requests,
    write_config,
)

WORKLOAD_SHAPE = {"W1": "qwen3-0.6b", "W2": "llama-3.1-8b"}


def engine_kwargs(folder: str, args) -> dict:
    """LLM arguments of every Octavo run of the workload (one engine or replicas)."""
    return dict(model=folder, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                max_model_len=4096, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                enforce_eager=args.enforce_eager, gpu_memory_utilization=0.9,
                tensor_parallel_size=args.tensor_parallel_size,
                kv_cache_dtype=args.kv_cache_dtype)


def sampling_extras(args) -> dict:
    """--penalties: every request asks for OpenAI's frequency and presence penalties and
    transformers' repetition penalty (the logits processing a step then does for each row);
    --logprobs K: for its tokens' logprobs and top K."""
    out = {}
    if getattr(args, "penalties", False):
        out.update(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1)
    if getattr(args, "logprobs", None) is not None:  # --logprobs K: K top logprobs a token
        out["logprobs"] = args.logprobs
    return out


def run_octavo(folder: str, prompts, max_tokens, args, backend: str = "uni") -> dict:
    import contextlib

    from benchmarks.common import StackSampler, TritonCompiles, timed_generate
    from octavo import LLM, SamplingParams

    llm = LLM(**engine_kwargs(folder, args), distributed_executor_backend=backend)
    engine = llm.llm_engine
    llm.generate([{"prompt_token_ids": prompts[0][:64]}],
                 SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m,
                             **sampling_extras(args)) for m in max_tokens]

    runs = []
    for _ in range(args.runs):
        # Every run computes its prompts: without this, a repeat run found every prompt in
        # the prefix cache (1 prefill step instead of 9 at W1) and read ~7% high.
        llm.reset_prefix_cache()
        engine.timings.trace = []
        engine.timings.reset()
        stacks = StackSampler() if args.stall_stacks else None
        mem0 = device_memory_counters()
        with TritonCompiles() as compiles, stacks or contextlib.nullcontext():
            wall, outs = timed_generate(llm, [{"prompt_token_ids": p} for p in prompts],
                                        params)
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        tm = engine.timings
        cfg = engine.config
        runs.append({"wall_s": wall, "output_tokens": n_out, "output_tok_s": n_out / wall,
                     "step_profile": tm.summary(),
                     "step_breakdown": step_breakdown(tm.trace),
                     "w5_kv_utilization": tm.kv_utilization(
                         cfg.scheduler_config.max_model_len, cfg.cache_config.block_size),
                     # Triton compiles inside the timed run (each a stall of its step)
                     "triton_compiles": compiles.events,
                     # cudaMalloc / cudaFree calls, retries and pinned host allocations
                     # inside the timed run (each may stall its step)
                     "device_memory_events": {k: v - mem0.get(k, 0) for k, v in
                                              device_memory_counters().items()}})
        if stacks is not None:  # the host's stacks through the slowest steps
            runs[-1]["slow_step_stacks"] = slow_step_stacks(tm.trace, stacks)
    first = runs[0]
    engine.shutdown()
    return {"engine": "octavo" if backend == "uni" else f"octavo ({backend} executor)",
            **first, "num_blocks": engine.num_blocks, "repeat_runs": runs[1:]}


def run_octavo_replicas(folder: str, prompts, max_tokens, args) -> dict:
    """The same requests over ``--data-parallel-size`` engine processes (one GPU each at
    TP=1), behind the replica router: ``LLM(data_parallel_size=N)``."""
    from octavo import LLM, SamplingParams

    n = args.data_parallel_size
    llm = LLM(**engine_kwargs(folder, args), data_parallel_size=n)
    # Warm every replica (least-loaded routing spreads 2n concurrent requests over all).
    llm.generate([{"prompt_token_ids": prompts[i][:64]} for i in range(2 * n)],
                 SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
    t0 = time.perf_counter()  # generate returns once every replica's tokens are back
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.llm_engine.shutdown()
    return {"engine": f"octavo ({n} replicas)", "wall_s": wall, "output_tokens": n_out,
            "output_tok_s": n_out / wall}


def step_breakdown(trace) -> dict:
    """Where the wall time went: steps with prefill work vs decode-only steps, and the
    slowest steps (a JIT compile or an allocator stall shows up there)."""
    prefill = [r for r in trace if r.num_scheduled_tokens > r.num_scheduled_reqs]
    decode = [r for r in trace if r.num_scheduled_tokens == r.num_scheduled_reqs]
    slow = slowest_steps(trace, 5)
    return {
        "prefill_steps": len(prefill), "prefill_s": sum(r.wall_s for r in prefill),
        "decode_steps": len(decode), "decode_s": sum(r.wall_s for r in decode),
        "mean_decode_batch": sum(r.num_scheduled_reqs for r in decode) / max(len(decode), 1),
        "decode_by_batch": decode_by_batch(decode),
        "slowest_steps": [{"step": i, "tokens": trace[i].num_scheduled_tokens,
                           "reqs": trace[i].num_scheduled_reqs, "running": trace[i].num_running,
                           "ms": round(1e3 * trace[i].wall_s, 2),
                           "schedule_ms": round(1e3 * trace[i].schedule_s, 2),
                           "execute_ms": round(1e3 * trace[i].execute_s, 2),
                           "output_ms": round(1e3 * trace[i].output_s, 2)} for i in slow],
    }


def slowest_steps(trace, count: int) -> list[int]:
    """Indices of the ``count`` slowest steps of ``trace``, slowest first."""
    return sorted(range(len(trace)), key=lambda i: -trace[i].wall_s)[:count]


def device_memory_counters() -> dict:
    """The CUDA caching allocators' event counters (device and pinned host) now; {} without
    CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    out = {k: stats.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc",
                                        "num_device_free", "num_ooms")}
    host = getattr(torch.cuda, "host_memory_stats", None)
    if host is not None:
        try:
            h = host()
            out.update({f"host_{k}": h.get(k, 0) for k in ("num_host_alloc", "num_host_free")})
        except RuntimeError:
            pass
    return out


def slow_step_stacks(trace, stacks, count: int = 3) -> list[dict]:
    """The sampled host stacks (``benchmarks.common.StackSampler``) inside the ``count``
    slowest steps, most frequent first."""
    out = []
    for i in slowest_steps(trace, count):
        t0, t1 = trace[i].start_s, trace[i].start_s + trace[i].wall_s
        out.append({"step": i, "ms": round(1e3 * trace[i].wall_s, 2),
                    "stacks": stacks.during(t0, t1), "gc": stacks.gc_during(t0, t1)})
    return out


DECODE_BUCKETS = (1, 17, 33, 65, 129, 193, 257)  # lower bounds: batches 1-16, 17-32, ...


def decode_by_batch(decode) -> list[dict]:
    """Decode steps grouped by batch size: how many, their wall seconds and mean step time
    (a step's fixed cost shows as the small batches' mean)."""
    rows = []
    for lo, hi in zip(DECODE_BUCKETS, DECODE_BUCKETS[1:]):
        sel = [r.wall_s for r in decode if lo <= r.num_scheduled_reqs < hi]
        if sel:
            rows.append({"batch": f"{lo}-{hi - 1}", "steps": len(sel), "s": round(sum(sel), 3),
                         "mean_ms": round(1e3 * sum(sel) / len(sel), 3)})
    return rows


def run_hf_static(folder: str, prompts, max_tokens, batch: int = 64) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    n_out = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ps, ms = prompts[i:i + batch], max_tokens[i:i + batch]
        width = max(len(p) for p in ps)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device="cuda")
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, do_sample=True, temperature=0.6,
                           max_new_tokens=max(ms), min_new_tokens=max(ms), pad_token_id=0)
        n_out += sum(ms)  # tokens past a request's own max_tokens are not counted
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"engine": "transformers-static-64", "wall_s": wall, "output_tokens": n_out,
            "output_tok_s": n_out / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOAD_SHAPE), default="W1")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--runs", type=int, default=1,
                    help="timed generate calls in one process (the first is the figure)")
    ap.add_argument("--peers", action="store_true", help="also run HF static generate")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--executors", default="uni",
                    help="comma-separated executor backends to run in turn (uni,mp): the "
                    "mp executor's per-step overhead against uni in the same call")
    ap.add_argument("--data-parallel-size", type=int, default=1,
                    help="N > 1: after the single engine, the same requests over N replicas "
                    "(LLM(data_parallel_size=N)) in the same call, and their ratio")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                    help="fp8: float8 KV blocks (half the bytes the decode attention reads)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--penalties", action="store_true",
                    help="every request with frequency 0.5, presence 0.3, repetition 1.1")
    ap.add_argument("--logprobs", type=int, default=None, metavar="K",
                    help="every request asks for its tokens' logprobs and the top K")
    ap.add_argument("--stall-stacks", action="store_true",
                    help="sample the host's Python stack every 2 ms through the timed run and "
                         "print the most frequent stacks inside the three slowest steps")
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES),
                    help="the workload's requests on another model shape (e.g. qwen3-30b-a3b)")
    args = ap.parse_args()

    from benchmarks.common import device_info, git_commit

    shape = args.shape or WORKLOAD_SHAPE[args.workload]
    folder = write_config(shape)
    prompts, max_tokens = w1_requests()
    assert sum(max_tokens) == 133966, sum(max_tokens)
    bw, flops, source = device_limits()
    bound_s = decode_bound_seconds([len(p) for p in prompts], max_tokens, shape_cost(shape),
                                   bw, flops)
    bound = sum(max_tokens) / bound_s
    result = {"workload": f"{args.workload} offline-256 ({shape}, bf16, dummy weights)",
              "device": device_info(), "commit": git_commit(), "limits": source,
              "bound_output_tok_s": bound, "date": time.strftime("%Y-%m-%d"), "runs": [],
              # (the bound counts bf16 KV bytes: an fp8 cache reads half of them)
              "kv_cache_dtype": args.kv_cache_dtype, "sampling_extras": sampling_extras(args) or None}
    print(f"{result['workload']} on {source}; commit {result['commit']}")
    print(f"memory-bandwidth bound: {bound:,.0f} output tok/s")
    octavo = run_octavo(folder, prompts, max_tokens, args, args.executors.split(",")[0])
    octavo["fraction_of_bound"] = octavo["output_tok_s"] / bound
    result["runs"].append(octavo)
    print(f"octavo: {octavo['output_tokens']} tokens in {octavo['wall_s']:.2f} s = "
          f"{octavo['output_tok_s']:,.0f} output tok/s ({octavo['fraction_of_bound']:.1%} of "
          f"bound)")
    print("step profile:", json.dumps(octavo["step_profile"]))
    print("step breakdown:", json.dumps(octavo["step_breakdown"]))
    if octavo.get("device_memory_events"):
        print("allocator events in the timed run:", octavo["device_memory_events"])
    for ev in octavo["triton_compiles"]:
        print(f"Triton compile in the timed run: {ev['kernel']} {ev['seconds']} s {ev['key']}")
    for slow in octavo.get("slow_step_stacks", []):
        print(f"host stacks in step {slow['step']} ({slow['ms']} ms); garbage collections "
              f"in it: {slow['gc']}")
        for st in slow["stacks"]:
            print(f"  {st['samples']} samples: " + " <- ".join(st["stack"]))
    w5 = octavo["w5_kv_utilization"]
    if w5:
        print(f"W5 KV utilization: paged {w5['paged_time_avg']:.1%} time-averaged "
              f"(min {w5['paged_min']:.1%}); contiguous preallocation to max_model_len "
              f"{w5['contiguous_time_avg']:.1%} (min {w5['contiguous_min']:.1%})")
    for i, r in enumerate(octavo["repeat_runs"], 2):
        print(f"octavo run {i}: {r['output_tok_s']:,.0f} output tok/s; "
              f"{json.dumps(r['step_breakdown'])}")
    for backend in args.executors.split(",")[1:]:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()  # the first engine's KV cache, before another takes 90%
        other = run_octavo(folder, prompts, max_tokens, args, backend)
        other["vs_first_executor"] = other["output_tok_s"] / octavo["output_tok_s"]
        result["runs"].append(other)
        print(f"{other['engine']}: {other['output_tok_s']:,.0f} output tok/s = "
              f"{other['vs_first_executor']:.3f}x the {args.executors.split(',')[0]} executor")
    if args.data_parallel_size > 1:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        dp = run_octavo_replicas(folder, prompts, max_tokens, args)
        dp["vs_one_engine"] = dp["output_tok_s"] / octavo["output_tok_s"]
        result["runs"].append(dp)
        print(f"{dp['engine']}: {dp['output_tok_s']:,.0f} output tok/s = "
              f"{dp['vs_one_engine']:.2f}x one engine")
    if args.peers:
        peer = run_hf_static(folder, prompts, max_tokens)
        result["runs"].append(peer)
        print(f"{peer['engine']}: {peer['output_tok_s']:,.0f} output tok/s; octavo is "
              f"{octavo['output_tok_s'] / peer['output_tok_s']:.1f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
