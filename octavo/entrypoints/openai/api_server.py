"""The OpenAI-compatible HTTP server:
``python -m octavo.entrypoints.openai.api_server --model ... --port ...`` or ``octavo serve``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response

import octavo
from octavo.config import KV_CACHE_DTYPES
from octavo.engine.arg_utils import EngineArgs
from octavo.entrypoints.engine_client import (
    EngineClient,
    add_replica_flag,
    health_response,
    make_engine,
    metrics_exporter,
    replica_flag_problems,
    wants_engine_process,
)
from octavo.entrypoints.header_deadline import DEFAULT_REQUEST_HEADER_TIMEOUT_S
from octavo.entrypoints.launcher import (
    DEFAULT_HOST,
    DEFAULT_SHUTDOWN_TIMEOUT,
    bind_and_start,
    serve_flags,
)
from octavo.entrypoints.openai.error_handlers import install_error_handlers
from octavo.entrypoints.openai.error_schema import document_errors
from octavo.entrypoints.openai.errors import APIError
from octavo.entrypoints.openai.middleware import (
    DEFAULT_REQUEST_BODY_TIMEOUT_S,
    AuthRateLimitMiddleware,
    BodyLimitMiddleware,
    TrustedHosts,
)

# Re-exported for apps built around the server, as the seed's guide writes it:
# app.add_middleware(RateLimitMiddleware, requests_per_minute=100) (the server's own limiter).
from octavo.entrypoints.openai.middleware import RateLimitMiddleware as RateLimitMiddleware
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from octavo.entrypoints.openai.request_body import offloaded_body_route
from octavo.entrypoints.openai.serving_chat import OpenAIServingChat
from octavo.entrypoints.openai.serving_completions import OpenAIServingCompletion
from octavo.entrypoints.openai.serving_engine import (
    DEFAULT_RENDER_TIMEOUT_S,
    ErrorGuardMiddleware,
)
from octavo.metrics.log_stats import DEFAULT_INTERVAL_S, LoggingStatLogger

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 2**20


@dataclass
class ServerSettings:
    served_model_names: Sequence[str] | None = None
    api_key: str | None = None
    rate_limit: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # A request body must have arrived within this many seconds of its headers (408 after).
    request_body_timeout: float = DEFAULT_REQUEST_BODY_TIMEOUT_S
    chat_template: str | None = None
    shutdown_engine: bool = True  # stop the engine loop when the app stops
    # A chat template (the server's or a request's) must render within this many seconds.
    chat_template_timeout: float = DEFAULT_RENDER_TIMEOUT_S
    # tool_choice "auto" reads tool calls out of the model's text with this parser.
    tool_call_parser: str | None = None
    # A request's own chat_template is code the server runs: refused unless trusted (vLLM's
    # --trust-request-chat-template). The time bound cannot stop a C-level operation such as
    # {{ 7 ** 10**9 }}, which holds the GIL and with it every thread of the server.
    trust_request_chat_template: bool = False


def build_app(engine: EngineClient, settings: ServerSettings | None = None) -> FastAPI:
    """A FastAPI app serving ``engine`` (an AsyncLLM, or a ReplicaRouter over engine
    processes). Several apps may share one engine."""
    s = settings or ServerSettings()
    mc = engine.model_config
    names = list(s.served_model_names or [mc.served_model_name])
    completions = OpenAIServingCompletion(engine, names)
    chat = OpenAIServingChat(engine, names, s.chat_template,
                             render_timeout=s.chat_template_timeout,
                             tool_call_parser=s.tool_call_parser,
                             trust_request_chat_template=s.trust_request_chat_template)
    metrics = metrics_exporter(engine, names[0])
    engine.stat_loggers.append(metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if metrics in engine.stat_loggers:
            engine.stat_loggers.remove(metrics)
        if s.shutdown_engine:
            engine.shutdown()

    app = FastAPI(title="Octavo OpenAI-compatible server", version=octavo.__version__,
                  lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    # A large JSON body is parsed and validated on the offload pool, not the event loop.
    app.router.route_class = offloaded_body_route(completions.offload)
    document_errors(app, api_key=s.api_key is not None, rate_limit=s.rate_limit is not None)

    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return health_response(engine)

    @app.get("/version")
    async def version():
        return {"version": octavo.__version__}

    @app.get("/metrics")
    async def get_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "octavo", "root": mc.model,
             "parent": None, "max_model_len": mc.max_model_len} for n in names]}

    @app.post("/v1/completions")
    async def create_completion(req: CompletionRequest, raw_request: Request):
        return await completions.create(req, raw_request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, raw_request: Request):
        return await chat.create(req, raw_request)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        completions.check_model(req.model)
        tokenizer = engine.get_tokenizer()
        if tokenizer is None:
            raise APIError(400, "this server has no tokenizer")
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of prompt or messages", param="prompt")
        if req.messages is not None:
            ids = (await chat.render(req.messages, None, req.add_generation_prompt)
                   )["prompt_token_ids"]
        else:  # a large prompt tokenizes for seconds: on a worker, not the event loop
            prompt, special = req.prompt, req.add_special_tokens
            ids = await completions.offload.run(
                lambda: tokenizer.encode(prompt, add_special_tokens=special))
        return await completions.json_response(lambda: {
            "count": len(ids), "max_model_len": mc.max_model_len, "tokens": list(ids)})

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        completions.check_model(req.model)
        tokenizer = engine.get_tokenizer()
        if tokenizer is None:
            raise APIError(400, "this server has no tokenizer")
        vocab = mc.hf_config.vocab_size
        tokens = req.tokens

        def decode() -> dict[str, str]:
            bad = next((t for t in tokens if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(400, f"tokens holds {bad}, not a token id in [0, {vocab})",
                               param="tokens")
            return {"prompt": tokenizer.decode(tokens)}

        return await completions.json_response(decode)

    # Outermost first: size limit, then key and rate limit.
    app.add_middleware(AuthRateLimitMiddleware, api_key=s.api_key, rate_limit=s.rate_limit)
    app.add_middleware(BodyLimitMiddleware, max_bytes=s.max_body_bytes,
                       timeout=s.request_body_timeout)
    # Outside everything: whatever escapes is a JSON 500, logged.
    app.add_middleware(ErrorGuardMiddleware)
    return app


# ---------------------------------------------------------------------- command line
def make_arg_parser(parser: argparse.ArgumentParser | None = None,
                    model_positional: bool = False) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(
        prog="python -m octavo.entrypoints.openai.api_server",
        description="Octavo OpenAI-compatible server")
    if model_positional:
        p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                       help="local HF folder or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"bind address (default: {DEFAULT_HOST}, loopback only; 0.0.0.0 for all "
                   "interfaces)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical", "trace"])
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--rate-limit", type=int, default=None,
                   help="requests per minute per client address")
    p.add_argument("--forwarded-allow-ips", default=None,
                   help="comma-separated proxy IPs or networks whose X-Forwarded-For names "
                   "the client: the right-most address not itself listed (default: none, the "
                   "header is ignored; '*' trusts every hop, so only behind a proxy that "
                   "overwrites the header)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                   help="on SIGTERM, seconds to let in-flight requests finish before ending "
                   "them with an error")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body accepted (413 above)")
    p.add_argument("--request-body-timeout", type=float, default=DEFAULT_REQUEST_BODY_TIMEOUT_S,
                   help="seconds a request body may take to arrive after its headers (408 "
                   "and the connection closed after that: a client trickling its body cannot "
                   "hold a connection)")
    p.add_argument("--request-header-timeout", type=float,
                   default=DEFAULT_REQUEST_HEADER_TIMEOUT_S,
                   help="seconds a connection may wait for a request's line and headers "
                   "(new, or between requests) before it is closed: a client sending them a "
                   "byte at a time, or nothing, cannot hold a connection")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template in chat requests (it is code the server runs: "
                   "only for trusted clients); without it such a request is a 400")
    p.add_argument("--guided-decoding-backend", default="xgrammar",
                   help="grammar backend for structured outputs (response_format, guided_*, "
                   "forced tool calls): xgrammar or auto")
    p.add_argument("--tool-call-parser", default=None,
                   help="parser for tool_choice 'auto' (hermes: the <tool_call> format of "
                   "Qwen2.5 / Qwen3 chat templates); without it 'auto' is refused")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's flag: tool_choice 'auto' (needs --tool-call-parser)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="names the API accepts (the first is reported)")
    p.add_argument("--model", default=None,
                   help="local HF folder or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--load-format", default="auto",
                   choices=["auto", "safetensors", "gguf", "dummy"],
                   help="dummy: random weights from config.json alone (benchmarks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                   help="swap: preempted requests keep their KV in CPU swap space")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="KV cache blocks in the model's dtype (auto) or float8 e4m3 (half the "
                   "memory per token; CUDA)")
    p.add_argument("--swap-space", type=float, default=4.0,
                   help="GiB of CPU memory for swapped KV blocks (with --preemption-mode swap)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="also serve Prometheus /metrics on this port (the main port's "
                   "/metrics stays)")
    p.add_argument("--metric-interval", type=float, default=DEFAULT_INTERVAL_S,
                   help="seconds between the logged stats lines (throughput, running and "
                   "waiting requests, KV cache usage, prefix-cache hit rate)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="do not log the periodic stats line")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="most logprobs / top_logprobs / prompt_logprobs per position a request "
                   "may ask for (vLLM's flag; -1: no cap)")
    p.add_argument("--max-n", type=int, default=None,
                   help="most samples (n, best_of) per request; default and upper bound: "
                   "--max-num-seqs")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True)
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs (every step launched eagerly)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule the next step while the device runs this one (default: "
                   "on for CUDA)")
    p.add_argument("--quantization", "-q", default=None,
                   help="weight quantization: awq, gptq, compressed-tensors, bitsandbytes, "
                   "fp8, gguf, ... (default: what the checkpoint declares, else none)")
    p.add_argument("--distributed-executor-backend", default=None,
                   help="uni (the model in the server's process), mp (one worker process per "
                   "rank, off the server's GIL) or ray (one Ray actor per rank); default uni "
                   "(mp for several ranks)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="ranks to split the model over, one worker process (mp) or Ray actor "
                   "(ray) each")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="automatic prefix caching (default: on)")
    add_replica_flag(p)
    return p


def unsupported_flags(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.tensor_parallel_size < 1:
        problems.append(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    backend = getattr(args, "distributed_executor_backend", None)
    if backend is not None:
        from octavo.executor.registry import known_backends

        if backend not in known_backends():
            problems.append(f"--distributed-executor-backend {backend!r} is not supported "
                            f"(known: {known_backends()})")
        elif backend == "ray":
            from octavo.executor.ray_executor import import_ray

            try:
                import_ray()
            except ImportError as e:
                problems.append(f"--distributed-executor-backend ray: {e}")
    if args.quantization is not None:
        from octavo.quantization.registry import known_methods

        if args.quantization not in known_methods():
            problems.append(f"--quantization {args.quantization!r} is not supported (known: "
                            f"{known_methods()})")
    if args.rate_limit is not None and args.rate_limit < 1:
        problems.append(f"--rate-limit must be >= 1, got {args.rate_limit}")
    if not args.metric_interval > 0:
        problems.append(f"--metric-interval must be > 0 seconds, got {args.metric_interval}")
    if args.metrics_port is not None and not (
            1 <= args.metrics_port <= 65535 and args.metrics_port != args.port):
        problems.append(f"--metrics-port must be a port number (1-65535) other than --port "
                        f"{args.port}, got {args.metrics_port}")
    if args.max_body_bytes < 1:
        problems.append(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.request_body_timeout > 0:
        problems.append(f"--request-body-timeout must be > 0 seconds, got "
                        f"{args.request_body_timeout}")
    if not args.request_header_timeout > 0:
        problems.append(f"--request-header-timeout must be > 0 seconds, got "
                        f"{args.request_header_timeout}")
    if not args.shutdown_timeout >= 0:
        problems.append(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.forwarded_allow_ips is not None:
        bad = TrustedHosts.problem(args.forwarded_allow_ips)
        if bad:
            problems.append(f"--forwarded-allow-ips {args.forwarded_allow_ips!r}: {bad}")
    problems += _tool_flag_problems(args)
    problems += replica_flag_problems(args)
    return problems


def _tool_flag_problems(args: argparse.Namespace) -> list[str]:
    from octavo.entrypoints.openai.tool_parsers import tool_parser_names
    from octavo.structured_output.backend import resolve_backend_name

    problems = []
    parser = getattr(args, "tool_call_parser", None)
    if parser is not None and parser not in tool_parser_names():
        problems.append(f"--tool-call-parser {parser!r}: choose one of {tool_parser_names()}")
    if getattr(args, "enable_auto_tool_choice", False) and parser is None:
        problems.append("--enable-auto-tool-choice needs --tool-call-parser")
    try:
        resolve_backend_name(getattr(args, "guided_decoding_backend", None))
    except ValueError as e:
        problems.append(f"--guided-decoding-backend: {e}")
    return problems


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    model = getattr(args, "model_tag", None) or args.model
    return EngineArgs(
        model=model, tokenizer=args.tokenizer, dtype=args.dtype, seed=args.seed,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        device=args.device, enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching is not False,
        scheduling_policy=args.scheduling_policy,
        preemption_mode=args.preemption_mode, swap_space=args.swap_space,
        kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling,
        max_logprobs=args.max_logprobs, max_n=args.max_n, load_format=args.load_format,
        quantization=args.quantization, tensor_parallel_size=args.tensor_parallel_size,
        distributed_executor_backend=getattr(args, "distributed_executor_backend", None),
        guided_decoding_backend=getattr(args, "guided_decoding_backend", None),
        served_model_name=args.served_model_name[0] if args.served_model_name else None)


def _read_template(value: str | None) -> str | None:
    if value is None:
        return None
    import os

    if os.path.isfile(value):
        with open(value) as f:
            return f.read()
    return value


def start_engine(args: argparse.Namespace) -> EngineClient | None:
    """The engine for parsed server flags (a ReplicaRouter with --num-replicas > 1); None
    (reasons printed) when flags are refused or the engine cannot start. Shared by this
    server and the simple /generate one."""
    problems = unsupported_flags(args)
    for msg in problems:
        print(f"octavo: error: {msg}", file=sys.stderr)
    if problems:
        return None
    num_replicas = getattr(args, "num_replicas", 1)
    interval = None if args.disable_log_stats else args.metric_interval
    try:
        engine_args = engine_args_from(args)
        engine_process = wants_engine_process(args, engine_args)
        engine = make_engine(engine_args, num_replicas,
                             args.served_model_name[0] if args.served_model_name else None,
                             log_stats_interval=interval, engine_process=engine_process)
    except (ValueError, ImportError, ConnectionError) as e:
        print(f"octavo: error: {e}", file=sys.stderr)
        return None
    except RuntimeError as e:  # a replica could not start
        print(f"octavo: error: {e}", file=sys.stderr)
        return None
    if interval is not None and num_replicas == 1 and not engine_process:
        # (replicas, the engine process among them, log their own)
        engine.stat_loggers.append(LoggingStatLogger(engine.engine, interval))
    return engine


def start_metrics_server(app: FastAPI, host: str | None, port: int):
    """Serve the app's Prometheus registry (what its own /metrics renders) on ``port`` too,
    from a daemon thread; returns the server (``shutdown()`` then ``server_close()`` stop it
    and free the port). OSError when the port cannot be bound."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host or DEFAULT_HOST,
                                  registry=app.state.metrics.registry)
    return server


def run_server(args: argparse.Namespace) -> int:
    started = bind_and_start(args, start_engine)
    if started is None:
        return 2
    sock, engine = started
    settings = ServerSettings(
        served_model_names=args.served_model_name, api_key=args.api_key,
        rate_limit=args.rate_limit, max_body_bytes=args.max_body_bytes,
        request_body_timeout=args.request_body_timeout,
        chat_template=_read_template(args.chat_template),
        tool_call_parser=getattr(args, "tool_call_parser", None),
        trust_request_chat_template=getattr(args, "trust_request_chat_template", False))
    app = build_app(engine, settings)
    from octavo.startup_heap import freeze_startup_heap, tune_collector_for_serving

    freeze_startup_heap()  # this process serves from here on
    tune_collector_for_serving()
    metrics_server = None
    if args.metrics_port is not None:
        try:
            metrics_server = start_metrics_server(app, args.host, args.metrics_port)
        except OSError as e:  # a port in use: say so instead of a traceback
            print(f"octavo: error: --metrics-port {args.metrics_port}: {e}", file=sys.stderr)
            engine.shutdown()
            sock.close()
            return 2
    try:
        return serve_flags(app, engine, args, sock)
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO)
    return run_server(make_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
