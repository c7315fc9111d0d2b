"""A mixture-of-experts GGUF on this CPU: Octavo (experts kept in their GGUF blocks) against
llama.cpp on the same file, batch-1 decode.

No MoE GGUF installs from the package registry, so the file is written here: llama.cpp's
``qwen3moe`` architecture at a small shape (default: hidden 1024, 12 layers, 64 experts of
intermediate 512, 8 a token; 1.25 B parameters, 1.2 B of them in experts), random weights in
Q4_0 (experts and attention; router and norms float32), the tokenizer metadata of the embedded
SmolLM2 file so both engines load it. Cached under ``--cache`` by shape.

    python benchmarks/moe_cpu.py [--llama-bench PATH] [--tokens 64] [--json-out F]

Octavo: one request of ``--prompt`` random token ids, ``--tokens`` greedy tokens with EOS
ignored, decode tok/s = (tokens - 1) / (time of the whole request - time of a 1-token
request), best of ``--repeat``. llama.cpp: ``llama-bench -p 0 -n TOKENS -t THREADS`` (its
``tg`` test: decode only, batch 1), built from the llama.cpp source vendored in
llama-cpp-python's source archive (``cmake --build build --target llama-bench``). Both use
all of this machine's cores unless ``--threads``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import cpu_count, device_info, git_commit, print_json_result  # noqa: E402
from benchmarks.gguf_cpu import llama_decode, octavo_rounds  # noqa: E402

SHAPE = dict(hidden=1024, layers=12, heads=16, kv_heads=4, head_dim=64, experts=64, top_k=8,
             expert_inter=512)


def write_moe_gguf(path: str, shape: dict, seed: int = 0) -> None:
    """A qwen3moe GGUF of ``shape`` with SmolLM2's tokenizer; Q4_0 matrices, float32 rest."""
    import gguf
    import numpy as np

    from octavo.default_model import default_model_path

    Q = gguf.GGMLQuantizationType  # noqa: N806
    src = gguf.GGUFReader(default_model_path())
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    h, hd, e, inter = shape["hidden"], shape["head_dim"], shape["experts"], shape["expert_inter"]
    w = gguf.GGUFWriter(path + ".tmp", "qwen3moe")
    w.add_block_count(shape["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(shape["heads"])
    w.add_head_count_kv(shape["kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(e)
    w.add_expert_used_count(shape["top_k"])
    w.add_expert_feed_forward_length(inter)
    for key, field in src.fields.items():
        if key.startswith("tokenizer."):
            types = [gguf.GGUFValueType(t) for t in field.types]
            w.add_key_value(key, field.contents(), types[0],
                            sub_type=types[1] if len(types) > 1 else None)
    rng = np.random.default_rng(seed)

    def mat(*dims: int, scale: float = 0.05):
        return gguf.quants.quantize((scale * rng.standard_normal(dims)).astype(np.float32),
                                    Q.Q4_0), Q.Q4_0

    def norm(n: int):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    tensors = {"token_embd.weight": mat(vocab, h), "output_norm.weight": norm(h),
               "output.weight": mat(vocab, h)}
    q, kv = shape["heads"] * hd, shape["kv_heads"] * hd
    for n in range(shape["layers"]):
        b = f"blk.{n}."
        tensors.update({
            b + "attn_norm.weight": norm(h), b + "attn_q.weight": mat(q, h),
            b + "attn_k.weight": mat(kv, h), b + "attn_v.weight": mat(kv, h),
            b + "attn_q_norm.weight": norm(hd), b + "attn_k_norm.weight": norm(hd),
            b + "attn_output.weight": mat(h, q), b + "ffn_norm.weight": norm(h),
            b + "ffn_gate_inp.weight": ((rng.standard_normal((e, h))).astype(np.float32), None),
            b + "ffn_gate_exps.weight": mat(e, inter, h), b + "ffn_up_exps.weight": mat(e, inter, h),
            b + "ffn_down_exps.weight": mat(e, h, inter)})
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


def octavo_decode(path: str, prompt: int, tokens: int, repeat: int) -> dict:
    import resource

    from octavo import LLM

    t0 = time.perf_counter()
    llm = LLM(model=path, device="cpu", skip_tokenizer_init=True, max_model_len=4096)
    load_s = time.perf_counter() - t0
    load_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"load_s": load_s, "peak_rss_mib_after_load": load_rss,
            **octavo_rounds(llm, prompt, tokens, repeat)()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/octavo/bench"))
    ap.add_argument("--llama-bench", default=None, help="path to llama.cpp's llama-bench")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    threads = args.threads or cpu_count()
    import torch

    torch.set_num_threads(threads)
    os.makedirs(args.cache, exist_ok=True)
    tag = "-".join(f"{k}{v}" for k, v in SHAPE.items())
    path = os.path.join(args.cache, f"qwen3moe-{tag}-q4_0.gguf")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        write_moe_gguf(path, SHAPE)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in "
              f"{time.perf_counter() - t0:.0f} s")
    result = {"benchmark": "MoE GGUF batch-1 decode on the CPU (qwen3moe, Q4_0, random)",
              "shape": SHAPE, "file_bytes": os.path.getsize(path), "threads": threads,
              "device": device_info(), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
              "prompt": args.prompt, "tokens": args.tokens}
    result["octavo"] = octavo_decode(path, args.prompt, args.tokens, args.repeat)
    print(f"octavo: {result['octavo']['decode_tok_s']:.1f} tok/s decode")
    if args.llama_bench:
        result["llama.cpp"] = llama_decode(args.llama_bench, path, args.tokens, threads,
                                           args.repeat)
        ratio = result["octavo"]["decode_tok_s"] / result["llama.cpp"]["decode_tok_s"]
        result["octavo_over_llama_cpp"] = ratio
        print(f"llama.cpp: {result['llama.cpp']['decode_tok_s']:.1f} tok/s decode; "
              f"octavo / llama.cpp = {ratio:.2f}x")
    print_json_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
