"""What the servers need of their engine beyond AsyncLLM's request interface, for either kind
they serve: one AsyncLLM in the server's process, or a ReplicaRouter over engine processes
(``--num-replicas N``). Both offer generate / abort / errored / dead_error / get_tokenizer /
model_config / fatal_callbacks / shutdown and an ``.engine`` with the processor the servers
validate through; these helpers cover where they differ: the metrics and /health."""

from __future__ import annotations

import argparse
import logging
from typing import Union

from fastapi.responses import JSONResponse, Response

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.openai.error_handlers import error_response
from octavo.replicas import ReplicaRouter

EngineClient = Union[AsyncLLM, ReplicaRouter]  # noqa: UP007 - a runtime alias


def make_engine(args: EngineArgs, num_replicas: int, model_name: str | None = None,
                log_stats_interval: float | None = None,
                engine_process: bool = False) -> EngineClient:
    """One AsyncLLM in this process (``num_replicas == 1`` without ``engine_process``), else
    a router over ``num_replicas`` engine processes (ValueError / RuntimeError when they
    cannot start). ``engine_process``: even one engine runs in a process of its own, so the
    server's process (its GIL) only serves HTTP and streams."""
    if num_replicas == 1 and not engine_process:
        return AsyncLLM.from_engine_args(args)
    return ReplicaRouter(args, num_replicas, model_name=model_name,
                         log_stats_interval=log_stats_interval,
                         log_level=logging.getLogger().getEffectiveLevel())


def metrics_exporter(engine: EngineClient, model_name: str):
    """The server's Prometheus exporter (``registry``, ``render``, ``record``): the engine's
    metrics, or every replica's under a ``replica`` label."""
    if isinstance(engine, ReplicaRouter):
        from octavo.replicas.metrics import ReplicaMetrics

        return ReplicaMetrics(engine, model_name)
    from octavo.metrics.prometheus import PrometheusStatLogger

    return PrometheusStatLogger(engine.engine, model_name)


def health_response(engine: EngineClient) -> Response:
    """GET /health. One engine: 200 (empty) while it lives, else 503. Replicas: 200 while at
    least one replica is ready, 503 when none is; the body lists every replica (state,
    pid, requests in flight, restarts, last error), so a replica being restarted shows here
    without taking the endpoint out of a load balancer."""
    if isinstance(engine, ReplicaRouter):
        healthy, report = engine.health_report()
        body = {"status": "ok" if healthy else "unavailable", "replicas": report}
        if engine.errored:
            body["error"] = repr(engine.dead_error)
        return JSONResponse(body, status_code=200 if healthy else 503)
    if engine.errored:
        return error_response(503, f"the engine is dead: {engine.dead_error!r}")
    return Response(status_code=200)


def add_replica_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-replicas", "--data-parallel-size", "-dp", dest="num_replicas",
                   type=int, default=1,
                   help="engine replicas behind this one endpoint, each a process of its own "
                   "(a Ray actor under --distributed-executor-backend ray) and each "
                   "--tensor-parallel-size ranks; a request goes to the least loaded; a "
                   "replica that dies is restarted (default 1: the engine in the server's "
                   "process). --data-parallel-size / -dp: vLLM's name for it")


    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine (scheduler, model, output building) in a process of "
                   "its own even with one replica, as vLLM's engine core: the server's "
                   "process then only serves HTTP, so streaming to many clients does not "
                   "slow the engine's steps (always so with --num-replicas > 1). Default: on "
                   "when the engine runs on CUDA (W3 on an H200: 81.8%% of offline "
                   "throughput against 56.6%% in the server's process), off on the CPU, "
                   "whose cores the two processes would share")


def wants_engine_process(args: argparse.Namespace, engine_args: EngineArgs) -> bool:
    """--engine-process as given, else on exactly when the engine's device is CUDA."""
    flag = getattr(args, "engine_process", None)
    if flag is not None:
        return flag
    import torch  # (is_available creates no CUDA context in this process)

    device = engine_args.device
    return (device == "auto" or device.startswith("cuda")) and torch.cuda.is_available()


def replica_flag_problems(args: argparse.Namespace) -> list[str]:
    n = getattr(args, "num_replicas", 1)
    return [] if n >= 1 else [f"--num-replicas must be >= 1, got {n}"]
