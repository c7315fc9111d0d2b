"""Structured outputs overhead: W6-style decode (the embedded SmolLM2, 32 chat prompts, greedy,
128 output tokens each) with every request guided by a JSON schema against none.

The schema asks for an array of at least 50 objects, so no guided request can finish before its
128 tokens: both runs decode the same number of tokens in batches of the same shape, and the
ratio guided / free is the cost of the grammar (bitmask fill on the host, mask on the device,
and no overlap with asynchronous scheduling). Target: guided >= 85% of free.

    python benchmarks/structured_outputs.py                   # CPU, float32
    python benchmarks/structured_outputs.py --device cuda --model /path/to/hf-folder
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from octavo import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

PROMPTS_FILE = os.path.join(REPO_ROOT, "benchmarks", "prompts", "chat_prompts.json")
SCHEMA = {"type": "array", "minItems": 50,
          "items": {"type": "object",
                    "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
                    "required": ["name", "note"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    with open(PROMPTS_FILE) as f:
        texts = json.load(f)[: args.num_prompts]
    llm = LLM(model=args.model, device=args.device, dtype=args.dtype, max_model_len=1024)
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": list(tok(tok.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False)["input_ids"])} for t in texts]
    free = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    guided = SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    llm.generate(prompts[:2], [free, guided], use_tqdm=False)  # warm-up, grammar compiled
    result = {}
    for name, params in (("free", free), ("guided", guided)):
        best = 0.0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            best = max(best, n / dt)
            if name == "guided":
                assert all(o.outputs[0].finish_reason == "length" for o in outs)
        result[name] = best
        print(f"{name:6s} {best:8.1f} output tok/s ({n} tokens)")
    result["ratio"] = result["guided"] / result["free"]
    print(f"guided / free: {result['ratio']:.1%} (target >= 85%)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
