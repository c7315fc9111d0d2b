"""The `octavo` command: `octavo generate PROMPT`, `octavo chat`, `octavo serve [MODEL]`."""

from __future__ import annotations

import argparse
import sys

from octavo.config import KV_CACHE_DTYPES
from octavo.sampling_params import SamplingParams


def _engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local HF folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None,
                   help="weight quantization (default: what the checkpoint declares; a .gguf "
                   "file on the CPU keeps its quantized blocks)")
    p.add_argument("--gguf-dequantize", action="store_true",
                   help="dequantize a .gguf file's weights at load (the float path)")
    p.add_argument("--distributed-executor-backend", default=None,
                   help="uni (default) or mp (the model in a worker process)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="KV cache blocks in the model's dtype (auto) or float8 e4m3 (CUDA)")
    p.add_argument("--swap-space", type=float, default=4.0,
                   help="GiB of CPU memory for swapped KV blocks (with --preemption-mode swap)")


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--sampling-seed", type=int, default=None)
    p.add_argument("--system", default=None, help="system prompt for the chat template")


def _make_llm(args):
    from octavo.entrypoints.llm import LLM

    return LLM(model=args.model, tokenizer=args.tokenizer, dtype=args.dtype, seed=args.seed,
               max_model_len=args.max_model_len, block_size=args.block_size,
               max_num_seqs=args.max_num_seqs, device=args.device,
               enforce_eager=args.enforce_eager, preemption_mode=args.preemption_mode,
               swap_space=args.swap_space, kv_cache_dtype=args.kv_cache_dtype,
               quantization=args.quantization,
               gguf_dequantize=args.gguf_dequantize,
               distributed_executor_backend=args.distributed_executor_backend,
               tensor_parallel_size=args.tensor_parallel_size)


def _params(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                          seed=args.sampling_seed)


def _messages(system: str | None, history: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + history


def cmd_generate(args) -> int:
    llm = _make_llm(args)
    params = _params(args)
    if args.raw:
        outs = llm.generate(args.prompts, params, use_tqdm=len(args.prompts) > 1)
    else:
        convs = [_messages(args.system, [{"role": "user", "content": p}]) for p in args.prompts]
        outs = llm.chat(convs, params, use_tqdm=len(args.prompts) > 1)
    for prompt, out in zip(args.prompts, outs):
        if len(args.prompts) > 1:
            print(f"### {prompt}")
        print(out.outputs[0].text.strip())
    return 0


def cmd_chat(args) -> int:
    llm = _make_llm(args)
    params = _params(args)
    history: list[dict] = []
    print("octavo chat: type a message, /reset to start over, /quit or Ctrl-D to leave.",
          file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line == "/reset":
            history.clear()
            continue
        history.append({"role": "user", "content": line})
        out = llm.chat(_messages(args.system, history), params, use_tqdm=False)[0]
        reply = out.outputs[0].text.strip()
        history.append({"role": "assistant", "content": reply})
        print(reply, flush=True)


def cmd_serve(args) -> int:
    try:
        from octavo.entrypoints.openai.api_server import run_server
    except ImportError as e:
        print(f"octavo: error: `octavo serve` needs fastapi and uvicorn ({e})", file=sys.stderr)
        return 2
    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="octavo", description="Octavo LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate replies to one or more prompts")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--raw", action="store_true",
                     help="send the prompt as is, without the chat template")
    _engine_flags(gen)
    _sampling_flags(gen)
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="interactive chat")
    _engine_flags(chat)
    _sampling_flags(chat)
    chat.set_defaults(func=cmd_chat)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    serve.set_defaults(func=cmd_serve)
    try:
        from octavo.entrypoints.openai.api_server import make_arg_parser
    except ImportError:  # fastapi / uvicorn missing: explain when `serve` is used
        serve.add_argument("rest", nargs=argparse.REMAINDER)
    else:
        make_arg_parser(serve, model_positional=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"octavo: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
