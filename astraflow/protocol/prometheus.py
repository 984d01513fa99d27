"""Prometheus ``/metrics`` of every service, with the tracker's names.

The tracker's tags are ``POLICY/FIELD`` (``policy/reward_mean``, ``policy/dropped_total/zero_variance``);
Prometheus names cannot hold ``/``, so each becomes ``astraflow_FIELD`` with the policy (and the
reason, node, task set ...) as labels: ``astraflow_dropped_total{policy="policy",
reason="zero_variance"}``. The list of names is :data:`DATAFLOW_METRICS` (from ``GET /status``,
built at scrape time, so the dataflow keeps no second set of counters) plus each service's own
histograms (:class:`ServiceMetrics`). Each service has its own registry: no global state, and
two services in one process (tests) do not mix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from astraflow.protocol.status import DataflowStatus

#: the Content-Type of a /metrics reply
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: name -> help of the families built from the dataflow's status (docs/observability.md lists them)
DATAFLOW_METRICS = {
    "astraflow_episodes": "Episodes pushed (counter)",
    "astraflow_episodes_per_s": "Episodes per second over the last minute",
    "astraflow_tasks_done": "Training tasks completed (counter)",
    "astraflow_leases_in_flight": "Leases held by nodes now",
    "astraflow_leases_expired": "Leases that expired (counter)",
    "astraflow_queue_tasks": "Pending tasks, by task set ('eval' for evaluations)",
    "astraflow_version": "Newest weight version, by policy",
    "astraflow_steps": "Optimizer steps acknowledged, by policy (counter)",
    "astraflow_buffer_groups": "Complete groups waiting for a batch, by policy",
    "astraflow_buffer_samples": "Samples waiting for a batch, by policy",
    "astraflow_unacked_batches": "Batches served but not acknowledged, by policy",
    "astraflow_dropped_total": "Samples dropped, by policy and reason (counter)",
    "astraflow_episode_errors": "Failed episodes, by reason (counter)",
    "astraflow_staleness": "Staleness (versions) of acknowledged samples, by policy (histogram)",
    "astraflow_node_episodes_per_s": "Episodes per second of each node",
    "astraflow_node_tokens_per_s": "Tokens per second of each node",
    "astraflow_node_weight_sync_s": "Seconds the node's latest weight update took",
    "astraflow_node_errors": "Failed episodes reported by each node (counter)",
}


#: name -> (help, WeightCacheStats field, kind) of a region weight cache's families
WEIGHT_CACHE_METRICS = {
    "astraflow_weight_cache_files_fetched": ("Files downloaded from upstream (misses, counter)",
                                             "files_fetched", "counter"),
    "astraflow_weight_cache_bytes_fetched": ("Bytes downloaded from upstream (counter)",
                                             "bytes_fetched", "counter"),
    "astraflow_weight_cache_files_rebuilt": ("Snapshots rebuilt from cached deltas (counter)",
                                             "files_rebuilt", "counter"),
    "astraflow_weight_cache_hits": ("File requests answered from the cache (counter)", "hits",
                                    "counter"),
    "astraflow_weight_cache_coalesced": ("Requests that joined a download under way (counter)",
                                         "coalesced", "counter"),
    "astraflow_weight_cache_files_served": ("Files sent to nodes (counter)", "files_served",
                                            "counter"),
    "astraflow_weight_cache_bytes_served": ("Bytes sent to nodes (counter)", "bytes_served",
                                            "counter"),
    "astraflow_weight_cache_upstream_errors": ("Failed upstream requests (counter)",
                                               "upstream_errors", "counter"),
    "astraflow_weight_cache_cached_files": ("Files held on disk", "cached_files", "gauge"),
    "astraflow_weight_cache_cached_bytes": ("Bytes held on disk", "cached_bytes", "gauge"),
}  # fmt: skip


def weight_cache_families(stats: Any) -> Iterator[Any]:
    """The metric families of a weight cache's :class:`~astraflow.protocol.WeightCacheStats`."""
    for name, (doc, field, kind) in WEIGHT_CACHE_METRICS.items():
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        fam = cls(name, doc, labels=[])
        fam.add_metric([], float(getattr(stats, field)))
        yield fam


def _family(kind: type, name: str, labels: list[str]):
    # prometheus_client appends "_total" to counters itself
    base = name.removesuffix("_total") if kind is CounterMetricFamily else name
    return kind(base, DATAFLOW_METRICS[name], labels=labels)


def status_families(st: DataflowStatus) -> Iterator[Any]:
    """The metric families of one status document."""
    for kind, name, value in (
        (CounterMetricFamily, "astraflow_episodes", st.episodes),
        (GaugeMetricFamily, "astraflow_episodes_per_s", st.episodes_per_s),
        (CounterMetricFamily, "astraflow_tasks_done", st.tasks_done),
        (GaugeMetricFamily, "astraflow_leases_in_flight", st.in_flight_leases),
        (CounterMetricFamily, "astraflow_leases_expired", st.expired_leases),
    ):
        fam = _family(kind, name, [])
        fam.add_metric([], value)
        yield fam
    queue = _family(GaugeMetricFamily, "astraflow_queue_tasks", ["task_set"])
    for task_set, n in sorted(st.queue.items()):
        queue.add_metric([task_set], n)
    yield queue
    per_policy = {
        name: _family(kind, name, ["policy"])
        for kind, name in (
            (GaugeMetricFamily, "astraflow_version"),
            (CounterMetricFamily, "astraflow_steps"),
            (GaugeMetricFamily, "astraflow_buffer_groups"),
            (GaugeMetricFamily, "astraflow_buffer_samples"),
            (GaugeMetricFamily, "astraflow_unacked_batches"),
        )
    }
    dropped = _family(CounterMetricFamily, "astraflow_dropped_total", ["policy", "reason"])
    staleness = _family(HistogramMetricFamily, "astraflow_staleness", ["policy"])
    for policy, p in sorted(st.policies.items()):
        for name, value in (
            ("astraflow_version", -1 if p.latest_version is None else p.latest_version),
            ("astraflow_steps", p.steps),
            ("astraflow_buffer_groups", p.buffer_groups),
            ("astraflow_buffer_samples", p.buffer_samples),
            ("astraflow_unacked_batches", p.unacked_batches),
        ):
            per_policy[name].add_metric([policy], value)
        for reason, n in sorted(p.dropped.items()):
            dropped.add_metric([policy, reason], n)
        counts = sorted((int(k), v) for k, v in p.staleness.items())
        buckets, seen = [], 0
        for k, n in counts:
            seen += n
            buckets.append((str(float(k)), seen))
        buckets.append(("+Inf", seen))
        staleness.add_metric([policy], buckets, sum(k * n for k, n in counts))
    yield from per_policy.values()
    yield dropped
    yield staleness
    errors = _family(CounterMetricFamily, "astraflow_episode_errors", ["reason"])
    for reason, e in sorted(st.errors.items()):
        errors.add_metric([reason], e.count)
    yield errors
    # A node names itself, so its name alone does not identify a series: a second node calling
    # itself "node-0" would duplicate (and hide) the real node-0's series. ``node_id`` is the id
    # the service issued at registration, unique per registration (issue 48, #8).
    nodes = {
        name: _family(kind, name, ["node", "node_id", "region"])
        for kind, name in (
            (GaugeMetricFamily, "astraflow_node_episodes_per_s"),
            (GaugeMetricFamily, "astraflow_node_tokens_per_s"),
            (GaugeMetricFamily, "astraflow_node_weight_sync_s"),
            (CounterMetricFamily, "astraflow_node_errors"),
        )
    }
    for n in st.nodes:
        labels = [n.name or n.id, n.id, n.region]
        nodes["astraflow_node_episodes_per_s"].add_metric(labels, n.episodes_per_s)
        for name, key in (
            ("astraflow_node_tokens_per_s", "tokens_per_s"),
            ("astraflow_node_weight_sync_s", "weight_sync_s"),
            ("astraflow_node_errors", "errors"),
        ):
            nodes[name].add_metric(labels, float(n.metrics.get(key, 0.0)))
    yield from nodes.values()


class _Snapshot:
    """A collector that yields families computed before the scrape (an async status read)."""

    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self) -> Iterator[Any]:
        yield from self.families


def exposition(registry: CollectorRegistry, extra: list[Any] | None = None) -> bytes:
    """The text exposition of ``registry`` plus ``extra`` families (e.g. the status ones)."""
    if not extra:
        return generate_latest(registry)
    both = CollectorRegistry()
    both.register(_Snapshot(extra))
    return generate_latest(registry) + generate_latest(both)


class ServiceMetrics:
    """A service's own histograms, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (), buckets=None):
        kwargs = {"buckets": buckets} if buckets else {}
        return Histogram(name, doc, labels, registry=self.registry, **kwargs)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return Gauge(name, doc, labels, registry=self.registry)


class Stopwatch:
    """``with Stopwatch(hist.labels(...))``: observe the block's wall time."""

    def __init__(self, metric: Any):
        self.metric = metric

    def __enter__(self) -> Stopwatch:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.metric.observe(time.perf_counter() - self.t0)
