"""The detokenizer on long outputs: engine-thread time per token as the text grows (the
embedded default model's tokenizer, random word-piece ids, one stop string and the DELTA
read a streamed request does each step).

    python benchmarks/detokenizer_long.py --tokens 32768
    PYTHONPATH=<exported tree> python benchmarks/detokenizer_long.py   # another tree

Prints microseconds per token for each quarter of the output, and the total.
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from octavo.default_model import default_model_path
    from octavo.engine.detokenizer import IncrementalDetokenizer
    from octavo.model_loader.gguf_file import open_gguf
    from octavo.sampling_params import SamplingParams

    tok = open_gguf(default_model_path()).load_tokenizer()
    rng = random.Random(0)
    ids = [rng.randrange(1000, 40000) for _ in range(args.tokens)]
    d = IncrementalDetokenizer(tok, [1, 2, 3], SamplingParams(stop=["\u2603never\u2603"],
                                                                max_tokens=args.tokens))
    sent = 0
    quarters = []
    t0 = last = time.perf_counter()
    for i, t in enumerate(ids, 1):
        d.add_token(t)
        # What a streamed request's output does each step: read the text not sent yet.
        n = d.text_len if hasattr(d, "text_len") else len(d.text)
        new = d.text_since(sent, n) if hasattr(d, "text_since") else d.text[sent:n]
        sent += len(new)
        if i % (args.tokens // 4) == 0:
            now = time.perf_counter()
            quarters.append(round((now - last) / (args.tokens // 4) * 1e6, 2))
            last = now
    total = time.perf_counter() - t0
    out = {"benchmark": "detokenizer_long", "tokens": args.tokens, "chars": sent,
           "us_per_token_by_quarter": quarters, "total_s": round(total, 3)}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
