"""Prometheus metrics of the proxy, on a registry of its own.

Label values are bounded: routes, status codes, reason slugs, mirror
indexes, never project names or paths, so cardinality stays fixed however
many packages pass through.

Under ``serve --workers N`` each worker calls :func:`enable_multiprocess`
before creating :class:`Metrics`: values then live in prometheus-client's
per-process files in one directory, and any worker's ``/metrics`` sums
them all (a dead worker's counters stay counted).  Gauges are per-worker
views and are combined over live workers: the least fresh trusted state
(``livemin``), the largest cache size seen (``livemax``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

__all__ = ["CONTENT_TYPE_LATEST", "BucketMetrics", "Metrics", "enable_multiprocess", "exposition", "mark_process_dead"]

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def enable_multiprocess(directory: Path) -> None:
    """Make the metrics created after this in this process shared through ``directory``.

    prometheus-client picks its value class when first imported, long
    before a worker is forked, so it is picked again here.
    """
    os.environ[_MULTIPROC_ENV] = str(directory)
    values.ValueClass = values.get_value_class()


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format: ``registry``, or every worker's values in multiprocess mode."""
    directory = os.environ.get(_MULTIPROC_ENV)
    if directory is None:
        return generate_latest(registry)
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=directory)
    return generate_latest(merged)


class BucketMetrics:
    """Traffic to the shared bucket (``--store s3://...``) by operation: head, get, put, delete."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.requests = Counter("tufproxy_bucket_requests_total", "Requests to the shared bucket by operation",
                                ["op"], registry=r)
        self.errors = Counter("tufproxy_bucket_errors_total", "Bucket requests that failed (unreachable, "
                              "timed out, refused) by operation", ["op"], registry=r)
        self.bytes = Counter("tufproxy_bucket_bytes_total", "Bytes read from (get) or written to (put) the bucket",
                             ["op"], registry=r)
        self.seconds = Histogram("tufproxy_bucket_request_duration_seconds", "Bucket request latency by operation",
                                 ["op"], buckets=_LATENCY_BUCKETS, registry=r)


class Metrics:
    """Every metric tufproxy exports."""

    def __init__(self) -> None:
        # Labelled children by (metric, label values): label values are bounded, so is this.
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry = CollectorRegistry()
        self.requests = Counter("tufproxy_requests_total", "Client requests by route and status", ["route", "status"], registry=r)
        self.request_seconds = Histogram(
            "tufproxy_request_duration_seconds", "Client request latency", ["route"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.hot_answers = Counter("tufproxy_hot_answers_total", "Requests answered below aiohttp's web layer "
                                   "(pages kept ready), by route; also counted in tufproxy_requests_total",
                                   ["route"], registry=r)
        self.hot_path = Gauge("tufproxy_hot_path_installed", "1 when warm pages are answered below aiohttp's web "
                              "layer, 0 when this aiohttp lacks what that needs (every request then takes aiohttp's "
                              "own path)", registry=r)
        self.cache_hits = Counter("tufproxy_cache_hits_total", "Requests answered from the verified cache", ["kind"], registry=r)
        self.cache_misses = Counter("tufproxy_cache_misses_total", "Requests that needed an upstream fetch", ["kind"], registry=r)
        self.cache_evictions = Counter("tufproxy_cache_evictions_total", "Blobs evicted from the cache", registry=r)
        self.cache_bytes = Gauge("tufproxy_cache_bytes", "Bytes of verified blobs on disk", registry=r,
                                 multiprocess_mode="livemax")
        self.upstream_fetches = Counter(
            "tufproxy_upstream_fetches_total", "Upstream fetches by mirror index and outcome", ["mirror", "outcome"], registry=r
        )
        self.upstream_seconds = Histogram(
            "tufproxy_upstream_fetch_duration_seconds", "Upstream fetch latency", ["mirror"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.upstream_bytes = Counter("tufproxy_upstream_bytes_total", "Bytes received from upstreams", ["mirror"], registry=r)
        self.foreseen = Counter("tufproxy_foreseen_total", "Files a gateway's publish answer carried, or named and "
                                "were downloaded ahead of their lookup, by outcome: used, or wasted (not asked for in "
                                "time, failed, too long)",
                                ["outcome"], registry=r)
        self.verification_failures = Counter(
            "tufproxy_verification_failures_total", "Artifacts or metadata refused, by reason", ["reason"], registry=r
        )
        self.refresh_failures = Counter(
            "tufproxy_refresh_failures_total", "Background metadata refreshes that failed, by reason", ["reason"], registry=r
        )
        self.refusals = Counter("tufproxy_refusals_total", "Refused requests by whose fault (kind) and reason",
                                ["kind", "reason"], registry=r)
        self.read_ahead = Counter("tufproxy_files_read_ahead_total", "Files fetched ahead of their request, "
                                  "when a client asked for their .metadata", registry=r)
        self.singleflight_joins = Counter(
            "tufproxy_singleflight_joins_total", "Requests that joined a fetch already in flight", registry=r
        )
        self.bucket = BucketMetrics(r)
        self.role_version = Gauge("tufproxy_trusted_role_version", "Trusted version of each top-level role", ["role"], registry=r,
                                  multiprocess_mode="livemin")
        self.role_expiry = Gauge(
            "tufproxy_role_expiry_seconds", "Seconds until each top-level role's trusted metadata expires", ["role"], registry=r,
            multiprocess_mode="livemin",
        )
        self.last_refresh = Gauge(
            "tufproxy_last_successful_refresh_timestamp_seconds", "Unix time of the last successful metadata refresh", registry=r,
            multiprocess_mode="livemin",
        )

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per process (the request path's hot calls)."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def hit(self, kind: str) -> None:
        self.child(self.cache_hits, kind).inc()

    def miss(self, kind: str) -> None:
        self.child(self.cache_misses, kind).inc()

    def request(self, route: str, status: int, seconds: float) -> None:
        """One client request answered."""
        self.child(self.requests, route, str(status)).inc()
        self.child(self.request_seconds, route).observe(seconds)

    def hot_request(self, route: str, status: int, seconds: float) -> None:
        """One client request answered by the hot path (:mod:`proxy.serving.hotpath`)."""
        self.request(route, status, seconds)
        self.child(self.hot_answers, route).inc()

    def exposition(self) -> bytes:
        """The text format: this process's registry, or every worker's in multiprocess mode."""
        return exposition(self.registry)
