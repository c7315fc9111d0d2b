"""Perplexity of a model on a fixed text (benchmarks/data/perplexity_text.txt) through Octavo, and
optionally through transformers as the peer, with how often the two agree.

The text is tokenized once (transformers' tokenizer of the model, no special tokens) and cut
into windows of ``--window`` tokens every ``--stride`` tokens; each window is one Octavo request
with ``prompt_logprobs=1``, and each token is scored once, by the first window in which it has
at least ``window - stride`` tokens of context (the first window scores all of its tokens).
Perplexity is ``exp(-mean logprob)`` over the scored tokens.

Agreement with the peer: the share of scored positions where both engines' most likely next
token is the same (teacher-forced top-1), the largest logprob difference, and greedy
continuations of a few prompts cut from the text (the tokens up to the first divergence).

Any checkpoint Octavo loads works: a GGUF file, a folder, ``--quantization`` (or the
checkpoint's own, detected). The peer runs in this process with ``--peer``, or in another
environment (e.g. one with GPTQModel for GPTQ / AWQ checkpoints)::

    python benchmarks/perplexity.py --engine transformers --model DIR --save peer.json
    python benchmarks/perplexity.py --model DIR --peer-json peer.json --json result.json

For GPTQ / AWQ folders the transformers peer dequantizes through GPTQModel in float32
(scripts/quant_fixtures/gptqmodel_reference.py); ``--peer-kernels`` keeps GPTQModel's kernels.
A float folder with ``--quantization bitsandbytes`` (``-nf4``, ``-fp4``) has transformers
quantize it at load with bitsandbytes too, each layer then dequantized by bitsandbytes into a
float Linear (the weight-only numerics Octavo runs); ``--peer-kernels`` keeps bitsandbytes'
own forward.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import REPO_ROOT, device_info, git_commit  # noqa: E402

DEFAULT_TEXT = os.path.join(REPO_ROOT, "benchmarks", "data", "perplexity_text.txt")
GREEDY_PROMPTS = 4  # prompts cut from the text for the greedy comparison
GREEDY_PROMPT_LEN = 48
GREEDY_TOKENS = 32


# ------------------------------------------------------------------------- text and windows

def _gguf_split(model: str) -> tuple[str, str | None]:
    """(folder, GGUF file name or None) for transformers."""
    if model.endswith(".gguf"):
        return os.path.dirname(model) or ".", os.path.basename(model)
    return model, None


def tokenize(model: str, tokenizer: str | None, text: str) -> list[int]:
    from transformers import AutoTokenizer

    folder, gguf = _gguf_split(tokenizer or model)
    tok = AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
    return tok(text, add_special_tokens=False)["input_ids"]


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over ``n`` tokens; a position p >= 1
    is scored (predicted from the tokens before it) by exactly one window."""
    if not 0 < stride < window:
        # A window's first token has no context in it: windows must overlap.
        raise ValueError(f"--stride {stride} must be in 1..{window - 1} (below --window)")
    out, scored_to, begin = [], 1, 0
    while scored_to < n:
        end = min(begin + window, n)
        out.append((begin, end, scored_to))
        scored_to = end
        begin += stride
    return out


def greedy_prompts(ids: list[int]) -> list[list[int]]:
    step = max(1, (len(ids) - GREEDY_PROMPT_LEN) // GREEDY_PROMPTS)
    return [ids[i * step: i * step + GREEDY_PROMPT_LEN] for i in range(GREEDY_PROMPTS)]


# ------------------------------------------------------------------------- engines

def octavo_run(args, ids: list[int]) -> dict[str, Any]:
    from octavo import LLM, SamplingParams

    kwargs = dict(model=args.model, dtype=args.dtype, max_model_len=args.window + 64,
                  skip_tokenizer_init=True)
    if args.quantization:
        kwargs["quantization"] = args.quantization
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t0
    model = llm.llm_engine.executor.worker.runner.model
    resident = sum(t.numel() * t.element_size()
                   for t in list(model.parameters()) + list(model.buffers()))
    wins = windows(len(ids), args.window, args.stride)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": ids[b:e]} for b, e, _ in wins], params,
                        use_tqdm=False)
    score_s = time.perf_counter() - t0
    logprobs, top1 = [], []
    for (b, _, first), out in zip(wins, outs):
        entries = out.prompt_logprobs  # entries[j]: token b + j given the ones before it
        for p in range(first, b + len(entries)):
            entry = entries[p - b]
            logprobs.append(entry[ids[p]].logprob)
            top1.append(next(t for t, lp in entry.items() if lp.rank == 1))
    greedy = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
    gen = llm.generate([{"prompt_token_ids": p} for p in greedy_prompts(ids)], greedy,
                       use_tqdm=False)
    return {"engine": "octavo", "logprobs": logprobs, "top1": top1,
            "greedy": [list(o.outputs[0].token_ids) for o in gen],
            "resident_weight_bytes": resident, "load_s": round(load_s, 1),
            "score_s": round(score_s, 1)}


def _declared_method(model: str) -> str | None:
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return (json.load(f).get("quantization_config") or {}).get("quant_method")


# Octavo's quantize-at-load bitsandbytes names as transformers' BitsAndBytesConfig arguments.
BNB_AT_LOAD = {
    "bitsandbytes": dict(load_in_8bit=True),
    "bitsandbytes-nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_use_double_quant=True),
    "bitsandbytes-fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4",
                             bnb_4bit_use_double_quant=False),
}


def _bitsandbytes_peer(folder: str, name: str, dtype, native: bool):
    """transformers quantizing a float checkpoint at load with bitsandbytes (needs it
    installed). Unless ``native``, every bitsandbytes layer then becomes a float Linear holding
    the weight bitsandbytes dequantizes it to: the weight-only numerics Octavo runs (the native
    8-bit forward also quantizes activations, the 4-bit one computes in the compute dtype)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = dict(BNB_AT_LOAD[name])
    if config.get("load_in_4bit"):
        config["bnb_4bit_compute_dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, device_map="cpu", quantization_config=BitsAndBytesConfig(**config))
    if not native:
        sys.path.insert(0, REPO_ROOT)
        from scripts.quant_fixtures.make_bitsandbytes import dense_in_memory, dequantized_twin
        model = dequantized_twin(model, dense_in_memory)  # float32 Linears; no .to(): bnb refuses
    return model


def transformers_run(args, ids: list[int]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[args.dtype if args.dtype != "auto" else "float32"]
    method = _declared_method(args.model)
    folder, gguf = _gguf_split(args.model)
    t0 = time.perf_counter()
    if method in ("gptq", "awq") and not args.peer_kernels:
        sys.path.insert(0, REPO_ROOT)
        from scripts.quant_fixtures.gptqmodel_reference import load_reference_model, to_float32_math
        model = load_reference_model(folder, method)
        to_float32_math(model, method)
    elif method is None and args.quantization in BNB_AT_LOAD:
        model = _bitsandbytes_peer(folder, args.quantization, dtype, args.peer_kernels)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, device_map="cpu", **({"gguf_file": gguf} if gguf else {}))
    model.eval()
    load_s = time.perf_counter() - t0
    logprobs, top1 = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for b, e, first in windows(len(ids), args.window, args.stride):
            logits = model(torch.tensor([ids[b:e]])).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)  # row j predicts token b + j + 1
            rows = torch.arange(first - 1 - b, e - 1 - b)
            targets = torch.tensor(ids[first:e])
            logprobs += lp[rows, targets].tolist()
            top1 += lp[rows].argmax(dim=-1).tolist()
        score_s = time.perf_counter() - t0
        greedy = []
        model.generation_config.eos_token_id = None  # like ignore_eos=True
        for p in greedy_prompts(ids):
            x = torch.tensor([p])
            gen = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=GREEDY_TOKENS, pad_token_id=0)
            greedy.append(gen[0, len(p):].tolist())
    return {"engine": "transformers", "logprobs": logprobs, "top1": top1, "greedy": greedy,
            "load_s": round(load_s, 1), "score_s": round(score_s, 1)}


# ------------------------------------------------------------------------- report

def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def agreement(ours: dict, peer: dict) -> dict[str, Any]:
    n = len(ours["top1"])
    if len(peer["top1"]) != n:
        raise ValueError(f"the peer scored {len(peer['top1'])} positions, Octavo {n}: same "
                         "text, window and stride?")
    same = sum(a == b for a, b in zip(ours["top1"], peer["top1"]))
    diffs = [abs(a - b) for a, b in zip(ours["logprobs"], peer["logprobs"])]
    prefix = []
    for a, b in zip(ours["greedy"], peer["greedy"]):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        prefix.append(k)
    return {"peer_perplexity": round(perplexity(peer["logprobs"]), 4),
            "top1_agreement": round(same / n, 4),
            "max_logprob_diff": round(max(diffs), 5),
            "mean_logprob_diff": round(sum(diffs) / n, 6),
            "greedy_identical": f"{sum(k == GREEDY_TOKENS for k in prefix)}/{len(prefix)}",
            "greedy_common_prefix": prefix}


def checkpoint_bytes(model: str) -> int:
    if os.path.isfile(model):
        return os.path.getsize(model)
    return sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model)
               if f.endswith((".safetensors", ".bin", ".gguf")))


def decoder_layer_bytes(model: str) -> int | None:
    """Bytes of the decoder layers' tensors in a safetensors checkpoint (the quantized part;
    embeddings and the LM head stay in full precision), read from the file headers."""
    if not os.path.isdir(model):
        return None
    total = 0
    for name in os.listdir(model):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                     if k != "__metadata__" and ".layers." in k)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="GGUF file or checkpoint folder (default: the embedded SmolLM2 GGUF)")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--quantization", default=None,
                    help="Octavo's quantization= (default: what the checkpoint declares)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=None, help="score only the first N")
    ap.add_argument("--engine", choices=("octavo", "transformers"), default="octavo")
    ap.add_argument("--peer", action="store_true", help="also run transformers in-process")
    ap.add_argument("--peer-json", default=None, help="a --save of the transformers engine")
    ap.add_argument("--peer-kernels", action="store_true",
                    help="GPTQ/AWQ peer: GPTQModel's kernels as they are (float16 math); "
                    "bitsandbytes peer: its own forward (int8 activations for 8-bit)")
    ap.add_argument("--save", default=None, help="write this engine's raw scores (JSON)")
    ap.add_argument("--load", default=None, help="this engine's scores from a --save")
    ap.add_argument("--json", default=None, help="write the result (JSON)")
    args = ap.parse_args()
    if args.model is None:
        from octavo.default_model import default_model_path
        args.model = default_model_path()

    with open(args.text) as f:
        ids = tokenize(args.model, args.tokenizer, f.read())
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    if args.load:
        with open(args.load) as f:
            run = json.load(f)
    else:
        run = (octavo_run if args.engine == "octavo" else transformers_run)(args, ids)
    run["ids_head"] = ids[:16]
    if args.save:
        with open(args.save, "w") as f:
            json.dump(run, f)
    result = {
        "model": args.model, "engine": args.engine,
        "quantization": args.quantization or _declared_method(args.model) or
        (("gguf" if args.dtype == "auto" else "gguf (dequantized)")  # the CPU default
         if args.model.endswith(".gguf") else None),
        "dtype": args.dtype, "text_tokens": len(ids), "window": args.window,
        "stride": args.stride, "scored_tokens": len(run["logprobs"]),
        "perplexity": round(perplexity(run["logprobs"]), 4),
        "checkpoint_bytes": checkpoint_bytes(args.model),
        "decoder_layer_bytes": decoder_layer_bytes(args.model),
        **{k: run[k] for k in ("resident_weight_bytes", "load_s", "score_s") if k in run},
    }
    peer = None
    if args.peer:
        peer = transformers_run(args, ids)
    elif args.peer_json:
        with open(args.peer_json) as f:
            peer = json.load(f)
        if peer["ids_head"] != ids[:16]:
            raise ValueError("the peer's scores are of a different tokenization")
    if peer is not None:
        result.update(agreement(run, peer))
    result.update(commit=git_commit(), device=device_info(),
                  date=time.strftime("%Y-%m-%d", time.gmtime()))
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
