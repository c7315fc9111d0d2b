"""W8 quantized decode (../shared/BENCHMARKS.md): the Llama-3.1-8B shape with bf16, W8A16 and
W4A16 (GPTQ layout, group 128) and fp8 weights, random (dummy) weights, one engine setting;
``w4a16_lmhead`` is W4A16 with the LM head quantized as well, ``w8a16_channel`` W8A16 with one
group per output channel (neither in the default list).

For each method: the weight memory, then for batch 1, 16, 64 and 256 (prompt 128, output 256)
the time per output token (decode only: a run to 257 tokens minus a run to 1 token, over the
256 steps between) and output tok/s, with the share of that time the step's weights alone
take to read at the device's published HBM bandwidth (``weight_read_fraction``: the KV cache
and activations not counted, so 1.0 is out of reach); then W2's 256-request workload.
Speedups are against bf16 measured in the same call. ``--shape qwen3-30b-a3b`` runs the
mixture-of-experts shape (its integer experts on the grouped kernel,
``octavo/kernels/fused_moe_int.py``).

    python benchmarks/quantized.py [--methods bf16,w8a16,w4a16,fp8] [--shape S] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import random
import sys

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    device_info,
    git_commit,
    print_json_result,
    published_hbm_tbps,
    timed_generate,
)
from benchmarks.workloads import w1_requests, write_config  # noqa: E402

SHAPE = "llama-3.1-8b"
# method: (quantization_config written into config.json, quantization=)
_GPTQ_G128 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
              "sym": True, "checkpoint_format": "gptq_v2"}
METHODS = {
    "bf16": (None, None),
    "w8a16": ({**_GPTQ_G128, "bits": 8}, None),
    # 8-bit with one group per output channel (llm-compressor's W8A16 preset is channel-wise):
    # the rows layout (octavo/kernels/int8_gemv.py; OCTAVO_INT_WEIGHT_LAYOUT=along_k for the
    # old one). Not in the default list.
    "w8a16_channel": ({**_GPTQ_G128, "bits": 8, "group_size": -1}, None),
    "w4a16": (_GPTQ_G128, None),
    "fp8": (None, "fp8"),
    # A block-scaled FP8 checkpoint (128 x 128, as Qwen3-30B-A3B-FP8 ships): MoE experts keep
    # their blocks (fused_moe's FP8 path); dense layers' dummy weights take per-tensor FP8
    # (a real block checkpoint's dense layers dequantize at load). Not in the default list.
    "fp8_block": ({"quant_method": "fp8", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128]}, None),
    # W4A16 with the LM head quantized too (GPTQModel's lm_head=True; here at the model's 4
    # bits and group 128), the head being the largest single weight a decode step reads.
    "w4a16_lmhead": ({**_GPTQ_G128, "lm_head": True}, None),
    # bitsandbytes NF4 (blocks of 64) quantized at load from the dummy bf16 weights; decode
    # rows through the Triton GEMV, or OCTAVO_BNB4_CUDA=1 the CUDA one. Not in the default
    # list.
    "nf4": (None, "bitsandbytes-nf4"),
}


def model_folder(method: str, shape: str = SHAPE) -> str:
    qcfg = METHODS[method][0]
    return write_config(shape, **({} if qcfg is None else {"quantization_config": qcfg}))


def weight_bytes(model, per_step: bool = False) -> int:
    """Bytes of every parameter and buffer except the rotary tables. ``per_step``: what a
    decode step reads once instead: less the embedding table (a lookup reads a few rows),
    a tied LM head counted once, by its own name."""
    total = 0
    for name, p in model.named_parameters(remove_duplicate=not per_step):
        if not (per_step and "embed_tokens" in name):
            total += p.numel() * p.element_size()
    for name, b in model.named_buffers():
        if not any(s in name for s in ("cos", "sin", "rotary", "inv_freq")):
            total += b.numel() * b.element_size()
    return total


def weight_read_fraction(step_bytes: int, tpot_ms: float, hbm_tbps: float | None) -> float | None:
    """The share of a decode step's ``tpot_ms`` that reading ``step_bytes`` of weights takes
    at ``hbm_tbps`` (None where the bandwidth is unknown)."""
    if not hbm_tbps or tpot_ms <= 0:
        return None
    return round(step_bytes / (hbm_tbps * 1e12) * 1e3 / tpot_ms, 3)


def run_method(method: str, args) -> dict:
    from octavo import LLM, SamplingParams

    llm = LLM(model=model_folder(method, args.shape), quantization=METHODS[method][1],
              load_format="dummy", dtype=args.dtype, skip_tokenizer_init=True, max_model_len=2048,
              max_num_seqs=args.max_num_seqs, gpu_memory_utilization=0.9)
    model = llm.llm_engine.executor.worker.runner.model
    layouts = collections.Counter(m.kernel_layout for m in model.modules()
                                  if getattr(m, "kernel_layout", None))
    out = {"method": method, "weight_bytes": weight_bytes(model),
           "step_weight_bytes": weight_bytes(model, per_step=True),
           "max_num_seqs": args.max_num_seqs, "layouts": dict(layouts), "batches": []}
    import torch

    hbm = published_hbm_tbps(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    rng = random.Random(0)

    def timed(prompts, max_tokens):
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)
        return timed_generate(llm, prompts, params)[0]

    for bs in args.batches:
        prompts = [{"prompt_token_ids": [rng.randrange(10000) for _ in range(args.prompt_len)]}
                   for _ in range(bs)]
        timed(prompts, 4)  # warm-up: compiles, captures this batch size's graph
        t_first = min(timed(prompts, 1) for _ in range(2))
        t_all = timed(prompts, args.output_len + 1)
        tpot = (t_all - t_first) / args.output_len
        read = weight_read_fraction(out["step_weight_bytes"], tpot * 1e3, hbm)
        out["batches"].append({"batch": bs, "tpot_ms": round(tpot * 1e3, 3),
                               "output_tok_s": round(bs / tpot, 1),
                               "weight_read_fraction": read})
        print(f"{method} batch {bs}: {tpot * 1e3:.3f} ms per output token, "
              f"{bs / tpot:,.0f} tok/s" + (f", weights read at {read:.0%} of HBM" if read
                                           else ""), flush=True)
    if not args.skip_w2:
        prompts, max_tokens = w1_requests()
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m)
                  for m in max_tokens]
        wall, outs = timed_generate(llm, [{"prompt_token_ids": p} for p in prompts], params)
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        out["w2"] = {"wall_s": round(wall, 2), "output_tokens": n,
                     "output_tok_s": round(n / wall, 1)}
        print(f"{method} W2: {n / wall:,.0f} output tok/s ({wall:.1f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="bf16,w8a16,w4a16,fp8")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--skip-w2", action="store_true")
    # The engine's limit (W2 runs 256 requests: a lower limit queues them).
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--shape", default=SHAPE)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                    help="the model's dtype (float16: as AutoAWQ / AutoGPTQ checkpoints run; "
                         "the \"bf16\" method is then the unquantized model in float16)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if max(args.batches) > args.max_num_seqs:
        ap.error(f"--batches {max(args.batches)} exceeds --max-num-seqs {args.max_num_seqs}: "
                 "the batch would queue, not decode together")
    from octavo.quantization.registry import known_methods

    results = []
    for method in args.methods.split(","):
        wanted = METHODS[method][1]
        if wanted is not None and wanted not in known_methods():
            print(f"{method}: quantization={wanted!r} is not registered; skipped")
            continue
        results.append(run_method(method, args))
        gc.collect()  # the engine (and its KV cache) is gone before the next one loads
        import torch

        torch.cuda.empty_cache()
    base = next((r for r in results if r["method"] == "bf16"), None)
    if base is not None:
        for r in results:
            r["weight_fraction_of_bf16"] = round(r["weight_bytes"] / base["weight_bytes"], 3)
            for row, ref in zip(r["batches"], base["batches"]):
                row["speedup_vs_bf16"] = round(ref["tpot_ms"] / row["tpot_ms"], 2)
            if "w2" in r and "w2" in base:
                r["w2"]["vs_bf16"] = round(r["w2"]["output_tok_s"]
                                           / base["w2"]["output_tok_s"], 2)
    for r in results:
        print(f"{r['method']}: weights {r['weight_bytes'] / 2**30:.2f} GiB "
              f"({r.get('weight_fraction_of_bf16', '-')} of bf16); " + ", ".join(
                  f"b{row['batch']} {row['tpot_ms']} ms x{row.get('speedup_vs_bf16', '-')}"
                  for row in r["batches"])
              + (f"; W2 {r['w2']['output_tok_s']} tok/s x{r['w2'].get('vs_bf16', '-')}"
                 if "w2" in r else ""))
    print_json_result({"benchmark": "quantized (W8)", "shape": args.shape, "dtype": args.dtype,
                       "device": device_info(), "commit": git_commit(), "results": results},
                      args.json)


if __name__ == "__main__":
    main()
