"""W6 cpu-small: Octavo against Hugging Face transformers on this CPU (see BENCHMARKS.md).

The embedded default model (SmolLM2-135M-Instruct GGUF) in float32, 32 chat prompts from
``benchmarks/prompts/chat_prompts.json`` wrapped in the model's chat template, greedy, 128 output
tokens per prompt with EOS ignored. Both engines get the same prompt token ids in the same run.

    python benchmarks/cpu_small.py                          # both engines
    python benchmarks/cpu_small.py --engines transformers --hf-batch-1
    python benchmarks/cpu_small.py --json-out /tmp/w6.json
    python benchmarks/cpu_small.py --engines octavo,octavo-gguf --gemm-seconds 0
    python benchmarks/cpu_small.py --engines octavo-gguf --llamacpp /work/venvs/llamacpp-site

``octavo-gguf`` keeps the GGUF weights quantized (the CPU default, dtype "auto"); ``octavo`` and
``octavo-bf16`` dequantize them. ``--llamacpp SITE`` adds W9 (benchmarks/cpu_peer.py): llama.cpp
through llama-cpp-python installed in SITE against Octavo, each in its own process.

Figures: output tokens, wall seconds (generate calls only; model load and warm-up excluded) and
output tok/s per engine, the ratio octavo/transformers, a compute-bound ceiling from this CPU's
measured fp32 GEMM rate, and (when both engines ran) how many prompts got identical token ids.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
import traceback
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.cpu_small`
    from common import (
        OtherLoad,
        describe_device,
        device_info,
        git_commit,
        print_json_result,
        wait_for_idle,
    )
except ImportError:  # pragma: no cover
    from benchmarks.common import (
        OtherLoad,
        describe_device,
        device_info,
        git_commit,
        print_json_result,
        wait_for_idle,
    )

WORKLOAD = "W6 cpu-small"
PROMPTS_FILE = os.path.join(REPO_ROOT, "benchmarks", "prompts", "chat_prompts.json")
ENGINES = ("octavo", "transformers", "octavo-bf16", "octavo-gguf")


# ----------------------------------------------------------------------------- inputs


def load_prompts(num_prompts: int) -> list[str]:
    with open(PROMPTS_FILE) as f:
        prompts = json.load(f)
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{PROMPTS_FILE} must hold a JSON list of strings")
    if num_prompts > len(prompts):
        raise ValueError(f"--num-prompts {num_prompts} > {len(prompts)} prompts in {PROMPTS_FILE}")
    return prompts[:num_prompts]


def build_token_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Chat-template each prompt as one user turn and tokenize it (the template has the specials)."""
    ids = []
    for p in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        ids.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return ids


# ----------------------------------------------------------------------------- physical limit


def count_flops_per_token(config: Any) -> dict[str, float]:
    """Matmul FLOPs per generated token ~= 2 x (non-embedding params + lm_head params).

    Attention score/value FLOPs (4 x layers x context x heads x head_dim) are left out: at the
    contexts of this workload (< 250 tokens) they add a few percent.
    """
    h = config.hidden_size
    n_layers = config.num_hidden_layers
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or h // n_heads
    inter = config.intermediate_size
    vocab = config.vocab_size
    attn = h * n_heads * head_dim + 2 * h * n_kv * head_dim + n_heads * head_dim * h
    mlp = 3 * h * inter
    norms = 2 * h
    non_embedding = n_layers * (attn + mlp + norms) + h  # + final norm
    lm_head = vocab * h
    return {
        "non_embedding_params": float(non_embedding),
        "lm_head_params": float(lm_head),
        "flops_per_token": 2.0 * (non_embedding + lm_head),
    }


def measure_gemm(m: int, k: int, n: int, seconds: float, dtype: torch.dtype) -> float:
    """GFLOP/s of torch.matmul(a[m,k], w[n,k].T) (nn.Linear's layout) over about `seconds`."""
    a = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    wt = w.t()
    for _ in range(3):
        torch.matmul(a, wt)
    iters = 0
    t0 = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(8):
            torch.matmul(a, wt)
        iters += 8
        elapsed = time.perf_counter() - t0
    return 2.0 * m * k * n * iters / elapsed / 1e9


# ----------------------------------------------------------------------------- engines


def run_transformers(
    model_dir: str,
    gguf_name: str,
    token_ids: list[list[int]],
    max_tokens: int,
    batch_size: int,
    pad_id: int,
    hf_batch_1: int,
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    t_load = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=gguf_name, dtype=torch.float32
    )
    model.eval()
    load_s = time.perf_counter() - t_load

    # EOS ignored (like SamplingParams(ignore_eos=True)): no EOS stops generation, and no EOS
    # logit is suppressed either (min_new_tokens would mask EOS and change the greedy tokens).
    # generate() fills unset (None) fields from model.generation_config, so clear it there too.
    model.generation_config.eos_token_id = None
    gen_config = copy.deepcopy(model.generation_config)
    gen_config.eos_token_id = None
    gen_config.pad_token_id = pad_id
    gen_config.do_sample = False
    gen_config.temperature = None
    gen_config.top_p = None
    gen_config.top_k = None

    def generate(batch: list[list[int]], n_new: int) -> list[list[int]]:
        gen_config.max_new_tokens = n_new
        width = max(len(x) for x in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, ids in enumerate(batch):  # left padding
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[i, width - len(ids) :] = 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=gen_config,
            )
        return [row[width:].tolist() for row in out]

    generate(token_ids[:1], 4)  # warm-up

    batch_size = max(1, min(batch_size, len(token_ids)))
    outputs: list[list[int]] = []
    other = OtherLoad()
    t0 = time.perf_counter()
    for start in range(0, len(token_ids), batch_size):
        outputs.extend(generate(token_ids[start : start + batch_size], max_tokens))
    wall = time.perf_counter() - t0
    other_cores = other.stop()
    n_out = sum(len(o) for o in outputs)
    if any(len(o) != max_tokens for o in outputs):
        print(f"WARNING: transformers output lengths {sorted({len(o) for o in outputs})}")
    result: dict[str, Any] = {
        "engine": "transformers",
        "label": f"transformers generate (batch {batch_size}, left padding)",
        "batch_size": batch_size,
        "output_tokens": n_out,
        "wall_s": wall,
        "tok_s": n_out / wall,
        "load_s": load_s,
        "other_cores": other_cores,
        "token_ids": outputs,
    }

    if hf_batch_1 > 0:
        single: list[list[int]] = []
        other = OtherLoad()
        t1 = time.perf_counter()
        for ids in token_ids[:hf_batch_1]:
            single.append(generate([ids], max_tokens)[0])
        wall1 = time.perf_counter() - t1
        other_cores1 = other.stop()
        n1 = sum(len(o) for o in single)
        result["batch_1"] = {
            "prompts": len(single),
            "output_tokens": n1,
            "wall_s": wall1,
            "tok_s": n1 / wall1,
            "other_cores": other_cores1,
            # padding check: batch-1 greedy tokens equal to the batched (left-padded) ones
            "identical_to_batched": sum(a == b for a, b in zip(single, outputs)),
        }

    return result  # the model is freed with this frame (main() runs gc.collect())


def run_octavo(model_path: str, token_ids: list[list[int]], max_tokens: int,
               dtype: str = "float32") -> dict[str, Any]:
    from octavo import LLM, SamplingParams

    t_load = time.perf_counter()
    llm = LLM(model=model_path, dtype=dtype)  # "auto": a .gguf file stays quantized on the CPU
    load_s = time.perf_counter() - t_load

    llm.generate(
        [{"prompt_token_ids": token_ids[0]}], SamplingParams(max_tokens=4), use_tqdm=False
    )  # warm-up

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    other = OtherLoad()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": ids} for ids in token_ids], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    other_cores = other.stop()
    outputs = [list(o.outputs[0].token_ids) for o in outs]
    n_out = sum(len(o) for o in outputs)

    del llm
    gc.collect()
    return {
        "engine": {"float32": "octavo", "auto": "octavo-gguf"}.get(dtype, f"octavo-{dtype}"),
        "label": f"octavo LLM.generate (one call, all prompts, "
                 f"{'GGUF blocks kept' if dtype == 'auto' else dtype})",
        "output_tokens": n_out,
        "wall_s": wall,
        "tok_s": n_out / wall,
        "load_s": load_s,
        "other_cores": other_cores,
        "token_ids": outputs,
    }


# ----------------------------------------------------------------------------- report


def compare_outputs(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    identical = 0
    first_diff = []
    for x, y in zip(a, b):
        if x == y:
            identical += 1
            continue
        n = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        first_diff.append(n)
    return {
        "prompts": len(a),
        "identical": identical,
        "first_divergence_positions": first_diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--engines",
        default="octavo,transformers",
        help="comma-separated subset of: octavo,transformers (run in that order)",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32, help="transformers generate batch size")
    ap.add_argument(
        "--hf-batch-1",
        nargs="?",
        type=int,
        const=2,
        default=0,
        metavar="N",
        help="also time transformers at batch 1 on the first N prompts (default N=2)",
    )
    ap.add_argument(
        "--gemm-seconds",
        type=float,
        default=1.5,
        help="seconds per GEMM shape for the fp32 rate measurement (0 to skip)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before the GEMM measurement and each engine, wait up to S seconds for other "
        "processes to leave the CPU idle (the machine is shared)",
    )
    ap.add_argument("--json-out", default=None, metavar="PATH")
    ap.add_argument("--llamacpp", default=None, metavar="SITE",
                    help="also run W9 against llama.cpp: llama-cpp-python installed in SITE "
                    "(pip install --target SITE llama-cpp-python)")
    args = ap.parse_args(argv)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        ap.error(f"unknown engine(s) {bad}; choose from {','.join(ENGINES)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoConfig, AutoTokenizer

    from octavo.default_model import default_model_path

    model_path = default_model_path()
    model_dir, gguf_name = os.path.split(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    config = AutoConfig.from_pretrained(model_dir, gguf_file=gguf_name)
    eos = config.eos_token_id  # from the GGUF metadata (2, <|im_end|>)
    pad_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)

    prompts = load_prompts(args.num_prompts)
    token_ids = build_token_ids(tokenizer, prompts)
    lens = [len(x) for x in token_ids]

    info = device_info()
    commit = git_commit()
    load_start = os.getloadavg()
    print(f"workload: {WORKLOAD}")
    print(f"device:   {describe_device(info)}")
    print(f"commit:   {commit}")
    print(f"load avg: {' '.join(f'{x:.2f}' for x in load_start)} (1/5/15 min, at start)")
    print(f"model:    {model_path} (float32)")
    print(
        f"prompts:  {len(token_ids)} chat prompts, {sum(lens)} prompt tokens "
        f"(min {min(lens)}, max {max(lens)}), greedy, {args.max_tokens} output tokens each, "
        "EOS ignored"
    )
    sys.stdout.flush()

    # Physical limit: FLOPs per token and this CPU's fp32 GEMM rate.
    flops = count_flops_per_token(config)
    gemm: dict[str, float] = {}
    m = max(1, min(args.batch_size, len(token_ids)))  # rows of the decode GEMMs at full batch
    if args.gemm_seconds > 0:
        shapes = {
            f"{m}x{config.hidden_size}x{config.intermediate_size}": (
                m,
                config.hidden_size,
                config.intermediate_size,
            ),
            f"{m}x{config.hidden_size}x{config.vocab_size}": (
                m,
                config.hidden_size,
                config.vocab_size,
            ),
            "1536x1536x1536": (1536, 1536, 1536),
        }
        if args.wait_idle > 0:
            wait_for_idle(args.wait_idle)
        other = OtherLoad()
        for name, (mm, kk, nn) in shapes.items():
            gemm[name] = measure_gemm(mm, kk, nn, args.gemm_seconds, torch.float32)
        gemm_other_cores = other.stop()
    else:
        gemm_other_cores = None

    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for engine in engines:
        if args.wait_idle > 0:
            load = wait_for_idle(args.wait_idle)
            if load is not None and load >= 0.1:
                print(f"(still {load:.2f} other cores busy after --wait-idle {args.wait_idle:g})")
        print(f"running {engine} ...", flush=True)
        try:
            if engine == "transformers":
                results[engine] = run_transformers(
                    model_dir,
                    gguf_name,
                    token_ids,
                    args.max_tokens,
                    args.batch_size,
                    pad_id,
                    args.hf_batch_1,
                )
            elif engine == "octavo-bf16":
                results[engine] = run_octavo(model_path, token_ids, args.max_tokens, "bfloat16")
            elif engine == "octavo-gguf":
                results[engine] = run_octavo(model_path, token_ids, args.max_tokens, "auto")
            else:
                results[engine] = run_octavo(model_path, token_ids, args.max_tokens)
        except Exception as exc:  # report and go on with the other engine
            traceback.print_exc()
            errors[engine] = f"{type(exc).__name__}: {exc}"
        gc.collect()

    # ---- print the figures
    def fmt_other(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    print()
    print(f"== {WORKLOAD} results ==")
    print(f"{'engine':<14}{'output tokens':>14}{'wall s':>10}{'tok/s':>10}{'other':>7}   notes")
    # Contended: other processes kept busier than the cores torch leaves free (+0.2 slack).
    spare_cores = max(0, info["cores"] - torch.get_num_threads()) + 0.2
    contended = []
    for engine in engines:
        if engine in errors:
            print(f"{engine:<14}{'-':>14}{'-':>10}{'-':>10}{'-':>7}   FAILED: {errors[engine]}")
            continue
        r = results[engine]
        print(
            f"{engine:<14}{r['output_tokens']:>14}{r['wall_s']:>10.2f}{r['tok_s']:>10.1f}"
            f"{fmt_other(r['other_cores']):>7}   {r['label']}; load {r['load_s']:.1f} s"
        )
        if (r["other_cores"] or 0) > spare_cores:
            contended.append(engine)
        if "batch_1" in r:
            b1 = r["batch_1"]
            print(
                f"{'  batch 1':<14}{b1['output_tokens']:>14}{b1['wall_s']:>10.2f}"
                f"{b1['tok_s']:>10.1f}{fmt_other(b1['other_cores']):>7}   transformers generate, "
                f"batch 1, first {b1['prompts']} prompts "
                f"({b1['identical_to_batched']}/{b1['prompts']} identical to the batched output)"
            )
            if (b1["other_cores"] or 0) > spare_cores:
                contended.append("transformers batch 1")
    print("  (other = average cores kept busy by other processes during the timed section)")

    ratio = None
    if "octavo" in results and "transformers" in results:
        ratio = results["octavo"]["tok_s"] / results["transformers"]["tok_s"]
        print(f"ratio octavo/transformers: {ratio:.2f}x")
    if "octavo-bf16" in results and "transformers" in results:
        r16 = results["octavo-bf16"]["tok_s"] / results["transformers"]["tok_s"]
        print(f"ratio octavo-bf16/transformers (fp32): {r16:.2f}x (not the W6 dtype)")

    print()
    fpt = flops["flops_per_token"]
    print(
        f"physical limit: {fpt / 1e6:.1f} MFLOP per generated token = 2 x "
        f"({flops['non_embedding_params'] / 1e6:.1f}M non-embedding + "
        f"{flops['lm_head_params'] / 1e6:.1f}M lm_head params); attention FLOPs not counted"
    )
    ceiling = None
    if gemm:
        print(
            f"  measured fp32 GEMM rate (torch.matmul, {torch.get_num_threads()} threads, "
            f"other = {fmt_other(gemm_other_cores)} cores):"
        )
        for name, rate in gemm.items():
            print(f"    {name:<18} {rate:7.1f} GFLOP/s  -> {rate * 1e9 / fpt:7.1f} tok/s")
        if (gemm_other_cores or 0) > spare_cores:
            contended.append("GEMM measurement")
        # The ceiling is the best measured rate: a batch-32 decode step could in principle run
        # its GEMMs at the CPU's peak; the decode-shaped rows show what torch gets at that shape.
        peak_name = max(gemm, key=gemm.get)
        ceiling = gemm[peak_name] * 1e9 / fpt
        print(
            f"  compute-bound ceiling at batch {m} (peak rate, {peak_name}; prefill not "
            f"counted): {ceiling:.0f} tok/s"
        )
        for engine in engines:
            if engine in results:
                frac = results[engine]["tok_s"] / ceiling
                results[engine]["fraction_of_ceiling"] = frac
                print(f"    {engine:<14} reaches {100 * frac:5.1f}% of it")

    load_end = os.getloadavg()
    print(f"load avg at end: {' '.join(f'{x:.2f}' for x in load_end)} (1/5/15 min)")
    if contended:
        print(
            "WARNING: other processes used the CPU during: "
            + ", ".join(contended)
            + " -- figures are not clean; rerun on an idle machine (or with --threads 1)"
        )

    agreement = None
    if "octavo" in results and "transformers" in results:
        agreement = compare_outputs(
            results["octavo"]["token_ids"], results["transformers"]["token_ids"]
        )
        print()
        print(
            f"greedy agreement: {agreement['identical']}/{agreement['prompts']} prompts have "
            "identical output token ids"
            + (
                f" (others diverge at positions {agreement['first_divergence_positions']})"
                if agreement["first_divergence_positions"]
                else ""
            )
        )

    if "octavo" in results and "octavo-gguf" in results:
        quant_agreement = compare_outputs(
            results["octavo-gguf"]["token_ids"], results["octavo"]["token_ids"]
        )
        print(
            f"quantized vs dequantized float32: {quant_agreement['identical']}/"
            f"{quant_agreement['prompts']} prompts identical"
            + (
                f" (others diverge at positions {quant_agreement['first_divergence_positions']})"
                if quant_agreement["first_divergence_positions"]
                else ""
            )
        )
    else:
        quant_agreement = None

    peers = None
    if args.llamacpp:
        try:
            from cpu_peer import TTFT_TOKENS, print_peers, run_peers
        except ImportError:  # pragma: no cover
            from benchmarks.cpu_peer import TTFT_TOKENS, print_peers, run_peers

        with open(os.path.join(REPO_ROOT, "benchmarks", "data", "perplexity_text.txt")) as f:
            long = tokenizer(f.read(), add_special_tokens=False)["input_ids"][:TTFT_TOKENS]
        peers = run_peers(model_path, token_ids, long, args.max_tokens, args.llamacpp,
                          threads=args.threads or 2)
        print_peers(peers)

    result = {
        "workload": WORKLOAD,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": info,
        "commit": commit,
        "command": " ".join([os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:]),
        "model": model_path,
        "dtype": "float32",
        "num_prompts": len(token_ids),
        "prompt_tokens": sum(lens),
        "max_tokens": args.max_tokens,
        "engines": {
            e: {k: v for k, v in r.items() if k != "token_ids"} for e, r in results.items()
        },
        "errors": errors,
        "ratio_octavo_over_transformers": ratio,
        "flops": flops,
        "gemm_gflops_fp32": gemm,
        "gemm_other_cores": gemm_other_cores,
        "ceiling_tok_s": ceiling,
        "contended": contended,
        "load_avg_start": load_start,
        "load_avg_end": load_end,
        "agreement": agreement,
        "agreement_quantized_vs_float32": quant_agreement,
        "w9_llamacpp": peers,
    }
    print()
    print_json_result(result, args.json_out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
