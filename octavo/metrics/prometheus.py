"""Prometheus exporter: vLLM's metric names under an `octavo:` prefix, labelled by model_name.

Each exporter owns its CollectorRegistry, so several servers can live in one process (tests).
Counters and histograms are fed on the engine thread (AsyncLLM's StatLogger hook); gauges are
read from the scheduler at scrape time, so they are fresh even when the engine is idle.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from octavo.engine.llm_engine import LLMEngine, StepStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class _PrefixCacheCollector:
    """prefix_cache_queries / prefix_cache_hits (tokens), read from the KV cache manager's
    running totals at scrape time."""

    def __init__(self, engine, model_name: str) -> None:
        self.engine = engine  # its scheduler (and KV manager) is replaced on a restart
        self.model_name = model_name

    def collect(self):
        kv = self.engine.scheduler.kv
        for name, doc, value in (
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                 kv.prefix_queries),
                ("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                 kv.prefix_hits)):
            fam = CounterMetricFamily(f"octavo:{name}", doc, labels=["model_name"])
            fam.add_metric([self.model_name], value)
            yield fam


class _PreemptionModeCollector:
    """num_preemptions_by_mode{mode="recompute"|"swap"}: the scheduler's running counts by
    kind, read at scrape time (their sum is num_preemptions)."""

    def __init__(self, engine, model_name: str) -> None:
        self.engine = engine  # its scheduler is replaced when the engine restarts
        self.model_name = model_name

    def collect(self):
        fam = CounterMetricFamily("octavo:num_preemptions_by_mode",
                                  "Request preemptions, by recompute or swap.",
                                  labels=["model_name", "mode"])
        for mode, value in sorted(self.engine.scheduler.preemptions_by_mode.items()):
            fam.add_metric([self.model_name, mode], value)
        yield fam


def metrics_model_name(name: str, model_path: str) -> str:
    """The ``model_name`` label for a served name. With no --served-model-name the served name
    defaults to the model's path; a label would then publish the server's filesystem layout
    (user names, mount points) to every scraper, so it becomes the folder or file name."""
    if name == model_path:
        return os.path.basename(os.path.normpath(name)) or name
    return name


class PrometheusStatLogger:
    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        model_name = metrics_model_name(model_name, engine.config.model_config.model)
        labels = ["model_name"]
        reg = self.registry
        # Read engine.scheduler at scrape time: a restart after a step fault replaces it.

        def gauge(name: str, doc: str, fn) -> None:
            g = Gauge(f"octavo:{name}", doc, labels, registry=reg)
            g.labels(model_name).set_function(fn)

        gauge("num_requests_running", "Requests in the running batch.",
              lambda: len(engine.scheduler.running))
        gauge("num_requests_waiting", "Requests waiting to be scheduled.",
              lambda: len(engine.scheduler.waiting))
        gauge("num_requests_swapped",
              "Requests preempted by swap, waiting with their KV in CPU blocks (counted in "
              "num_requests_waiting too).",
              lambda: len(engine.scheduler.swap.req_to_cpu_blocks))
        gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = 100%).",
              lambda: engine.scheduler.kv.usage)
        self.prompt_tokens = Counter("octavo:prompt_tokens", "Prefill tokens processed.",
                                     labels, registry=reg).labels(model_name)
        self.generation_tokens = Counter("octavo:generation_tokens", "Tokens generated.",
                                         labels, registry=reg).labels(model_name)
        self.num_preemptions = Counter("octavo:num_preemptions", "Request preemptions.",
                                       labels, registry=reg).labels(model_name)
        self.request_success = Counter("octavo:request_success", "Requests that finished.",
                                       labels + ["finished_reason"], registry=reg)
        self.e2e = Histogram("octavo:e2e_request_latency_seconds",
                             "Request latency from arrival to the last token.", labels,
                             buckets=_LATENCY_BUCKETS, registry=reg).labels(model_name)
        self.ttft = Histogram("octavo:time_to_first_token_seconds",
                              "Time from arrival to the first generated token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=reg).labels(model_name)
        self.tpot = Histogram("octavo:time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              labels, buckets=_TPOT_BUCKETS, registry=reg).labels(model_name)
        self.queue = Histogram("octavo:request_queue_time_seconds",
                               "Time from arrival to first admission into the batch.", labels,
                               buckets=_LATENCY_BUCKETS, registry=reg).labels(model_name)
        self.model_name = model_name
        reg.register(_PrefixCacheCollector(engine, model_name))
        reg.register(_PreemptionModeCollector(engine, model_name))

    def record(self, stats: StepStats | None, num_new_preemptions: int, finished) -> None:
        if stats is not None:
            self.prompt_tokens.inc(stats.num_prompt_tokens)
            self.generation_tokens.inc(stats.num_generation_tokens)
        if num_new_preemptions:
            self.num_preemptions.inc(num_new_preemptions)
        for f in finished:
            self.request_success.labels(self.model_name, f.finish_reason).inc()
            self.e2e.observe(f.e2e_seconds)
            if f.ttft_seconds is not None:
                self.ttft.observe(f.ttft_seconds)
                if f.num_output_tokens > 1:
                    self.tpot.observe((f.e2e_seconds - f.ttft_seconds)
                                      / (f.num_output_tokens - 1))
            if f.queue_seconds is not None:
                self.queue.observe(f.queue_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
