"""Prometheus metrics of the gateway, on a registry of its own.

Labels are bounded (outcomes, reason slugs, routes, status codes): never
a project, a file name, an index URL or credentials.  Under ``gateway
serve --workers N`` counters are summed across workers (as for ``serve``,
:mod:`proxy.util.metrics`) and gauges show the largest live worker's value.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.protocol.errors import Fault
from proxy.protocol.refusals import rule_fault
from proxy.util.metrics import BucketMetrics, exposition

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    """Every metric ``tufproxy gateway serve`` exports."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "tufproxy_gateway_requests_total", "Requests by route and status", ["route", "status"], registry=r
        )
        self.pages_fetched = Counter(
            "tufproxy_gateway_pages_fetched_total", "Index pages fetched, by outcome", ["outcome"], registry=r
        )
        self.prefetches = Counter(
            "tufproxy_gateway_prefetches_total",
            "Dependency prefetches by outcome: published (or already was), refused by policy or the index, "
            "failed, unreachable, bad-metadata",
            ["outcome"], registry=r,
        )
        self.publishes = Counter(
            "tufproxy_gateway_publishes_total", "Batches signed (one snapshot and timestamp each)", registry=r
        )
        self.publish_seconds = Histogram(
            "tufproxy_gateway_publish_duration_seconds", "Time to sign and write one batch", buckets=_BUCKETS, registry=r
        )
        self.published_projects = Counter("tufproxy_gateway_published_projects_total", "Project pages signed", registry=r)
        self.pins_refused = Counter(
            "tufproxy_gateway_pins_refused_total",
            "Listed files left out because they differ from their pin (upstream-changed-file)",
            registry=r,
        )
        self.files = Counter("tufproxy_gateway_files_total", "Files fetched from an index, by outcome (read-ahead: a "
                             ".metadata file the prefetch read, kept at its first request)", ["outcome"], registry=r)
        self.read_ahead_waits = Counter(
            "tufproxy_gateway_read_ahead_waits_total",
            "Requests for a .metadata the dependency prefetch was still reading, which waited for that read rather "
            "than asking the index again", registry=r)
        self.files_read_ahead = Counter(
            "tufproxy_gateway_files_read_ahead_total",
            "Distribution files fetched ahead of any request for them, when a client asked for their .metadata",
            registry=r)
        self.file_bytes = Counter("tufproxy_gateway_file_bytes_total", "Verified bytes of files fetched from indexes", registry=r)
        self.signing_errors = Counter("tufproxy_gateway_signing_errors_total",
                                      "Times the online key failed to sign (token removed, KMS unreachable)", registry=r)
        self.refusals = Counter("tufproxy_gateway_refusals_total", "Refusals by whose fault (kind) and reason",
                                ["kind", "reason"], registry=r)
        self.ignored_files = Counter(
            "tufproxy_gateway_ignored_files_total",
            "Entries of index pages left out by design: not a distribution of that project (.egg, bad names)",
            registry=r)
        self.policy_hidden = Gauge(
            "tufproxy_gateway_policy_hidden_files",
            "Files the policy leaves out of signed pages now, by rule",
            ["rule"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.advisory_blocks = Gauge(
            "tufproxy_gateway_advisory_blocked_files",
            "Files OSV advisories keep out of signed pages now, by rule (advisory-malicious, advisory-vulnerable)",
            ["rule"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.timestamp_version = Gauge(
            "tufproxy_gateway_timestamp_version", "Version of the published timestamp", registry=r, multiprocess_mode="livemax"
        )
        self.timestamp_expiry = Gauge(
            "tufproxy_gateway_timestamp_expiry_seconds",
            "Seconds until the published timestamp expires",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.usage_entries = Gauge(
            "tufproxy_gateway_usage_entries",
            "Entries kept per project name, by structure (used, fetched, absent; each bounded, oldest evicted)",
            ["structure"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.advisory_feeds_answered = Gauge(
            "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds",
            "Unix time every --advisories-url last answered (a new body or 304), the start time until the first "
            "answer; 0 without feeds",
            registry=r, multiprocess_mode="livemax",
        )
        self.projects = Gauge("tufproxy_gateway_projects", "Projects published", registry=r, multiprocess_mode="livemax")
        self.bucket = BucketMetrics(r)  # the push to --store
        # --leader-lease (one process per replica: --workers 1)
        self.leader = Gauge("tufproxy_gateway_leader", "1 on the replica holding the leader lease, 0 elsewhere",
                            registry=r, multiprocess_mode="livemax")
        self.lease_generation = Gauge("tufproxy_gateway_lease_generation",
                                      "Generation of the leader lease as this replica last saw it (one more per change "
                                      "of leader)", registry=r, multiprocess_mode="livemax")
        self.lease_lost = Counter("tufproxy_gateway_lease_lost_total",
                                  "Times this replica stopped leading without releasing the lease (taken over, "
                                  "expired, or a fenced write refused)", registry=r)

    def refused(self, reason: str, fault: Fault | None = None) -> Fault:
        """Count one refusal; ``fault`` defaults to the one table's for a gateway rule.  Returns it for the audit."""
        fault = fault or rule_fault(reason)
        self.refusals.labels(fault.value, reason).inc()
        return fault

    def batch(self, projects: int, seconds: float) -> None:
        self.publishes.inc()
        self.published_projects.inc(projects)
        self.publish_seconds.observe(seconds)

    def lease_changed(self, leader: bool, generation: int) -> None:
        self.leader.set(1 if leader else 0)
        self.lease_generation.set(generation)

    def exposition(self) -> bytes:
        return exposition(self.registry)
