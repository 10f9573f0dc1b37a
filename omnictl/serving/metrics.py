"""Prometheus metrics of one server: request outcomes, latency histograms, in flight.

Each server owns its own registry, so two servers in one process (tests, bench)
never share counters. Per-stage and per-edge figures come from the profiler through
:meth:`ServerMetrics.observe_stage` / :meth:`observe_edge`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# seconds: from a few milliseconds (an in-process hop) to a minute (a long CPU answer)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
OUTCOMES = ("completed", "failed", "aborted", "rejected")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "omnictl_requests", "Chat completion requests by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:  # export zeros so dashboards see every series from the start
            self.requests.labels(outcome)
        self.in_flight = Gauge("omnictl_requests_in_flight", "Requests admitted and not finished", registry=self.registry)
        self.first_text = Histogram(
            "omnictl_time_to_first_text_seconds", "Admission to first text delta",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.first_audio = Histogram(
            "omnictl_time_to_first_audio_seconds", "Admission to first audio delta",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.e2e = Histogram(
            "omnictl_request_latency_seconds", "Admission to the last result (end to end)",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.stage = Histogram(
            "omnictl_stage_latency_seconds", "Time a request spends in one stage (input received to done)",
            ["stage"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.edge = Histogram(
            "omnictl_edge_latency_seconds", "Hop latency from sent to received, per edge",
            ["src", "dst"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )

    def outcome(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.stage.labels(stage).observe(seconds)

    def observe_edge(self, src: str, dst: str, seconds: float) -> None:
        self.edge.labels(src, dst).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
