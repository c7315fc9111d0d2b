"""``/metrics`` over every replica: each replica's ``octavo:`` metrics with a ``replica`` label,
plus the router's own per-replica gauges.

A replica feeds a ``PrometheusStatLogger`` of its own (the same metrics a single engine
has) and sends a plain snapshot of its registry every ``STATS_INTERVAL_S``; the router's
collector merges the latest snapshot of every replica into one family per metric name at
scrape time, so a scrape never waits on a replica. A restarted replica's counters start again
from zero (Prometheus reads that as a counter reset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.replicas.router import ReplicaRouter

Snapshot = list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]


def snapshot(registry) -> Snapshot:
    """A registry's metrics as plain tuples: (name, type, help, [(sample, labels, value)])."""
    return [(m.name, m.type, m.documentation,
             [(s.name, dict(s.labels), float(s.value)) for s in m.samples])
            for m in registry.collect()]


class _ReplicaCollector:
    def __init__(self, router: ReplicaRouter, model_name: str) -> None:
        self.router = router
        self.model_name = model_name

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.metrics_core import Metric

        families: dict[str, Metric] = {}
        for slot in self.router.slots:
            replica = str(slot.index)
            for name, typ, doc, samples in slot.stats or ():
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = Metric(name, doc, typ)
                for sample, labels, value in samples:
                    fam.add_sample(sample, {**labels, "replica": replica}, value)
        yield from families.values()
        labels = ["model_name", "replica"]
        up = GaugeMetricFamily("octavo:replica_up", "1 while the replica is ready to serve.",
                               labels=labels)
        flight = GaugeMetricFamily("octavo:replica_requests_in_flight",
                                   "Requests the router has sent to the replica and not seen "
                                   "finish.", labels=labels)
        restarts = CounterMetricFamily("octavo:replica_restarts",
                                       "Times the replica was restarted after it died.",
                                       labels=labels)
        for slot in self.router.slots:
            key = [self.model_name, str(slot.index)]
            up.add_metric(key, 1.0 if slot.state == "ready" else 0.0)
            flight.add_metric(key, slot.in_flight)
            restarts.add_metric(key, slot.num_restarts)
        yield up
        yield flight
        yield restarts


class ReplicaMetrics:
    """The router's exporter: the interface ``PrometheusStatLogger`` offers the servers
    (``registry``, ``render``; ``record`` is a no-op, stats come from the replicas)."""

    def __init__(self, router: ReplicaRouter, model_name: str) -> None:
        from prometheus_client import CollectorRegistry

        from octavo.metrics.prometheus import metrics_model_name

        self.model_name = metrics_model_name(model_name, router.model_config.model)
        self.registry = CollectorRegistry()
        self.registry.register(_ReplicaCollector(router, self.model_name))

    def record(self, stats, num_new_preemptions: int, finished) -> None:
        pass

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
