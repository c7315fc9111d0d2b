"""Long-context decode pace: N requests decode; their time per output token undisturbed, then
while one long (8k-token) prompt prefills, with chunked prefill on (a per-step token budget)
and off (the whole prompt in one step).

    python benchmarks/long_context.py                          # SmolLM2-135M shape, dummy weights
    python benchmarks/long_context.py --num-running 8 --prompt-len 8192 --budget 512 \
        --json-out long_context.json

Runs on CUDA when it is available (``--device``), on the CPU otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import sys
import tempfile
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# SmolLM2-135M's shape with a 16k position limit, so that an 8k prompt and its neighbours fit.
SMALL_SHAPE = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
                   intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, vocab_size=49152, max_position_embeddings=16384,
                   rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                   hidden_act="silu", torch_dtype="bfloat16")


def _small_model() -> str:
    folder = tempfile.mkdtemp(prefix="octavo-long-context-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(SMALL_SHAPE, f)
    return folder


def _timed_step(engine) -> float:
    t0 = time.perf_counter()
    engine.step()
    return time.perf_counter() - t0


def run(args, chunked: bool) -> dict:
    """One engine; the running requests' ms per output token before and during the prefill."""
    import torch

    from octavo import LLM, SamplingParams

    max_len = args.prompt_len + 64
    budget = args.budget if chunked else max_len + args.num_running
    llm = LLM(model=args.model, dtype=args.dtype, load_format=args.load_format,
              device=args.device, skip_tokenizer_init=True, max_model_len=max_len,
              enable_chunked_prefill=chunked, max_num_batched_tokens=budget,
              max_num_seqs=args.num_running + 1, enable_prefix_caching=False)
    engine = llm.llm_engine
    rng = random.Random(0)
    vocab = engine.config.model_config.hf_config.vocab_size
    tokens = lambda n: [rng.randrange(10, vocab) for _ in range(n)]  # noqa: E731
    warm = [{"prompt_token_ids": tokens(n)} for n in (16, min(args.budget, args.prompt_len))]
    llm.generate(warm, SamplingParams(max_tokens=4), use_tqdm=False)  # allocator, CUDA graphs

    ids = [f"run-{i}" for i in range(args.num_running)]
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for rid in ids:
        engine.add_request(rid, {"prompt_token_ids": tokens(args.running_prompt_len)}, params)
    running = [engine.scheduler.requests[rid] for rid in ids]
    while min(r.num_output_tokens for r in running) < 1:
        engine.step()
    for _ in range(4):
        engine.step()
    steady = [_timed_step(engine) for _ in range(args.decode_steps)]

    engine.add_request("long", {"prompt_token_ids": tokens(args.prompt_len)},
                       SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    long_req = engine.scheduler.requests["long"]
    before = [r.num_output_tokens for r in running]
    during = []
    engine.timings.reset()
    on_cuda = args.device != "cpu" and torch.cuda.is_available()  # as main() decides
    profiler = contextlib.nullcontext()
    if args.profile and chunked:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU]
                           + ([ProfilerActivity.CUDA] if on_cuda else []))
    with profiler as prof:
        while long_req.num_output_tokens == 0:
            during.append(_timed_step(engine))
            assert engine.last_stats.num_scheduled_tokens <= budget
    if prof is not None:
        print(f"profile of the {len(during)} steps while the prompt prefills (timings below "
              "include the profiler's overhead):")
        print(prof.key_averages().table(sort_by="cuda_time_total" if on_cuda else
                                        "cpu_time_total", row_limit=16,
                                        max_name_column_width=70))
    per_request = [r.num_output_tokens - b for r, b in zip(running, before)]
    host = {k: v for k, v in engine.timings.summary().items() if k.endswith("_ms_per_step")}
    engine.abort_request(ids)
    del llm, engine
    gc.collect()

    steady_ms = 1000 * sum(steady) / len(steady)
    # Every running request gets one token per step (the test checks it), so the time per
    # output token during the prefill is the prefill window over the tokens each received.
    during_ms = 1000 * sum(during) / min(per_request)
    return {"chunked_prefill": chunked, "max_num_batched_tokens": budget,
            "steady_ms_per_token": steady_ms, "during_prefill_ms_per_token": during_ms,
            "ratio": during_ms / steady_ms, "worst_step_ms": 1000 * max(during),
            "prefill_steps": len(during), "tokens_per_running_request": min(per_request),
            "long_prompt_ttft_s": sum(during), "host_during_prefill": host}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="folder or .gguf (default: SmolLM2-135M shape, dummy weights)")
    ap.add_argument("--load-format", default=None)
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-running", type=int, default=4)
    ap.add_argument("--running-prompt-len", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens (chunked)")
    ap.add_argument("--decode-steps", type=int, default=32, help="undisturbed steps timed")
    ap.add_argument("--modes", default="on,off", help="chunked prefill: on, off or both")
    ap.add_argument("--wait-idle", type=float, default=60.0,
                    help="wait up to this many seconds for other load to settle (0: no)")
    ap.add_argument("--profile", action="store_true",
                    help="print a torch.profiler table of the chunked run's prefill steps")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    import torch

    from benchmarks.common import (
        OtherLoad,
        describe_device,
        device_info,
        git_commit,
        print_json_result,
        wait_for_idle,
    )

    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.dtype = args.dtype or ("bfloat16" if on_cuda else "float32")
    if args.model is None:
        args.model, args.load_format = _small_model(), args.load_format or "dummy"
    args.load_format = args.load_format or "auto"
    print(f"long-context decode pace: {args.num_running} running requests, one "
          f"{args.prompt_len}-token prompt, {args.dtype}; commit {git_commit()}")
    print(describe_device())
    if args.wait_idle > 0:
        wait_for_idle(args.wait_idle)
    load = OtherLoad()
    runs = [run(args, mode == "on") for mode in args.modes.split(",")]
    other = load.stop()
    for r in runs:
        print(f"chunked prefill {'on ' if r['chunked_prefill'] else 'off'} "
              f"(max_num_batched_tokens {r['max_num_batched_tokens']}): "
              f"{r['steady_ms_per_token']:.1f} ms/token undisturbed, "
              f"{r['during_prefill_ms_per_token']:.1f} ms/token while the prompt prefills "
              f"({r['ratio']:.2f}x), worst step {r['worst_step_ms']:.0f} ms, "
              f"{r['prefill_steps']} prefill steps, long prompt TTFT "
              f"{r['long_prompt_ttft_s']:.2f} s")
        print("  host work per step while it prefills: " + ", ".join(
            f"{k.removesuffix('_ms_per_step')} {v:.2f} ms"
            for k, v in r["host_during_prefill"].items()))
    if other is not None:
        print(f"other processes kept {other:.2f} cores busy on average")
    print_json_result({"benchmark": "long_context", "device": device_info(),
                       "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
                       "args": vars(args), "other_load_cores": other, "runs": runs},
                      args.json_out)


if __name__ == "__main__":
    main()
