"""Prometheus metrics of one server: request outcomes, latency histograms, in flight.

Each server owns its own registry, so two servers in one process (tests, bench)
never share counters. Per-stage and per-edge latency come from the profiler's live
aggregator at scrape time, as summaries (p50 / p99 over its sliding window).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from omnictl.playback.continuity import GAP_THRESHOLDS_MS, Continuity

# the *_created series only add noise to every scrape
disable_created_metrics()

# seconds: from a few milliseconds (an in-process hop) to a minute (a long CPU answer)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# seconds from the end of a spoken turn: the goal is first audio within 0.5 s
TURN_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
OUTCOMES = ("completed", "failed", "aborted", "rejected")
# seconds a listener waits with nothing to play: 20 ms is inaudible, a second is a break
UNDERRUN_BUCKETS = (0.0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# time to the last chunk / seconds of audio: under 1 keeps up with real time
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
AUDIO_LABELS = ("model", "endpoint")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "omnictl_requests", "Chat completion requests by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:  # export zeros so dashboards see every series from the start
            self.requests.labels(outcome)
        self.in_flight = Gauge(
            "omnictl_requests_in_flight", "Requests admitted and not finished", registry=self.registry
        )
        self.overloaded = Counter(
            "omnictl_admission_rejections",
            "Requests refused by admission control, by reason",
            ["reason"],
            registry=self.registry,
        )
        for reason in ("over_limit", "queue_timeout", "underrun"):
            self.overloaded.labels(reason)
        # Requests waiting for admission now; set by the server to its admission's count.
        self.queue_depth = Gauge("omnictl_admission_queue_depth", "Requests waiting for a slot", registry=self.registry)
        # Per stage: how long its current compute step (one call, on one request) has run;
        # set from the stages' stats each second (the liveness watch) and on each /health.
        self.stage_busy = Gauge(
            "omnictl_stage_busy_seconds",
            "Seconds each stage's current compute step (one call on one request) has run, by `stage`; 0 when idle",
            ["stage"],
            registry=self.registry,
        )
        self.first_text = Histogram(
            "omnictl_time_to_first_text_seconds",
            "Admission to first text delta",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_audio = Histogram(
            "omnictl_time_to_first_audio_seconds",
            "Admission to first audio delta",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "omnictl_request_latency_seconds",
            "Admission to the last result (end to end)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # A realtime turn's milestones, each from the end of its speech (the pause a preemptive
        # answer started at, else speech stopped; the commit where no VAD decided the turn):
        # omnictl.serving.realtime.session.milestones.
        self.turn = Histogram(
            "omnictl_realtime_turn_seconds",
            "Realtime turn: seconds from the end of speech to each milestone, by `milestone`",
            ["milestone"],
            buckets=TURN_BUCKETS,
            registry=self.registry,
        )
        # Answers started when the user's speech paused, before the turn was confirmed: "used"
        # (the turn ended there: it was the response), "dropped" (the user went on speaking,
        # or the client acted, or it was not ready): omnictl.serving.realtime.session.replies.
        self.preemptive = Counter(
            "omnictl_realtime_preemptive_answers",
            "Realtime answers started at a pause in speech, by `outcome` (used, dropped)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("used", "dropped"):
            self.preemptive.labels(outcome)
        # What dropped early answers may have computed for nothing: the seconds from each one's
        # start (its tail transcription, its thinker and first clause) to its drop, when its
        # requests were aborted; with the turns' count, the share benchmarks/realtime_latency.py prints.
        self.preemptive_dropped_s = Counter(
            "omnictl_realtime_preemptive_dropped_seconds",
            "Realtime answers started at a pause and dropped: seconds from their start to the drop, summed",
            registry=self.registry,
        )
        self.audio = AudioMetrics(self.registry)
        self.profile = ProfileMetrics()
        self.registry.register(self.profile)
        self._counts = dict.fromkeys(OUTCOMES, 0)  # the counter's values, readable without a scrape
        self.processes = ProcessMetrics()
        self.registry.register(self.processes)

    def outcome(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()
        self._counts[outcome] += 1

    def count(self, outcome: str) -> int:
        """Requests with this outcome so far (``rejected``: refused with a 4xx/503)."""
        return self._counts[outcome]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class AudioMetrics:
    """The continuity of every audio stream that left the server, by model and endpoint:
    the playback clock's figures (:mod:`omnictl.playback.continuity`) once a stream ends."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttfp = Histogram(
            "omnictl_audio_time_to_first_packet_seconds",
            "Request to the first audio chunk sent, per audio stream",
            AUDIO_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rtf = Histogram(
            "omnictl_audio_real_time_factor_ratio",
            "Request to the last audio chunk sent, divided by the seconds of audio sent",
            AUDIO_LABELS,
            buckets=RTF_BUCKETS,
            registry=registry,
        )
        self.largest_underrun = Histogram(
            "omnictl_audio_largest_underrun_seconds",
            "Longest wait of a real-time listener with nothing to play, per audio stream",
            AUDIO_LABELS,
            buckets=UNDERRUN_BUCKETS,
            registry=registry,
        )
        self.chunk_interval = Histogram(
            "omnictl_audio_chunk_interval_seconds",
            "Time between consecutive audio chunks sent",
            AUDIO_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.streams = Counter(
            "omnictl_audio_streams", "Audio streams that sent audio", AUDIO_LABELS, registry=registry
        )
        self.continuous = Counter(
            "omnictl_audio_continuous_streams",
            "Audio streams whose largest underrun stayed at or under threshold_ms",
            (*AUDIO_LABELS, "threshold_ms"),
            registry=registry,
        )

    def observe(self, model: str, endpoint: str, report: Continuity) -> None:
        if report.ttfp_s is None:
            return  # no audio left: nothing was played
        labels = (model, endpoint)
        self.ttfp.labels(*labels).observe(report.ttfp_s)
        if report.rtf is not None:
            self.rtf.labels(*labels).observe(report.rtf)
        self.largest_underrun.labels(*labels).observe(report.largest_underrun_s)
        interval = self.chunk_interval.labels(*labels)
        for seconds in report.intervals_s:
            interval.observe(seconds)
        self.streams.labels(*labels).inc()
        for ms in GAP_THRESHOLDS_MS:
            counter = self.continuous.labels(*labels, str(ms))
            if report.largest_underrun_s * 1000 <= ms:
                counter.inc()


class ProfileMetrics(Collector):
    """A custom collector: per-stage and per-edge latency from the profiler's aggregator.

    ``snapshot`` is set once the pipeline is up; it returns an
    :class:`omnictl.profiling.aggregate.ProfileSnapshot` (or None when profiling is off).
    """

    # (name, type, help, labels) of what collect() yields: the docs' metrics reference reads it
    FAMILIES = (
        ("omnictl_stage_latency_seconds", "summary", "Time at a stage, first input to done", ("stage",)),
        ("omnictl_edge_latency_seconds", "summary", "Hop latency, sent to received, per edge", ("src", "dst", "kind")),
    )

    def __init__(self) -> None:
        self.snapshot: Callable[[], Any] | None = None

    def describe(self) -> list[Metric]:
        return []  # series appear with the stages; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot() if self.snapshot is not None else None
        if snap is None:
            return
        (stage_name, _, stage_help, _), (edge_name, _, edge_help, _) = self.FAMILIES
        stage = Metric(stage_name, f"{stage_help} (profiler window {snap.window_s:g}s)", "summary")
        for name, stats in snap.stages.items():
            _quantiles(stage, stage_name, {"stage": name}, stats.p50_s, stats.p99_s)
            stage.add_sample(f"{stage_name}_count", {"stage": name}, float(stats.done))
        edge = Metric(edge_name, f"{edge_help} (profiler window {snap.window_s:g}s)", "summary")
        for (src, dst, kind), stats in snap.edges.items():
            labels = {"src": src, "dst": dst, "kind": kind}
            _quantiles(edge, edge_name, labels, stats.p50_s, stats.p99_s)
            edge.add_sample(f"{edge_name}_count", labels, float(stats.hops))
        yield stage
        yield edge


class ProcessMetrics(Collector):
    """``omnictl_process_up{process="tts#1", group="tts"}``: 1 per stage process (each
    replica on its own) that is up, 0 while it is down. ``pipeline`` is set once it is up."""

    FAMILIES = (
        ("omnictl_process_up", "gauge", "Stage process (replica) up: 1, down: 0", ("process", "group")),
        ("omnictl_replicas", "gauge", "Replicas of an elastic process running now", ("group",)),
        (
            "omnictl_scaling_decisions",
            "counter",
            "The autoscaler's decisions for an elastic process, by direction (up, down)",
            ("group", "direction"),
        ),
        ("omnictl_requests_replayed", "counter", "Requests re-run from the entry after a replica died", ()),
        (
            "omnictl_requests_resumed",
            "counter",
            "Of the replays, autoregressive streams resumed with the tokens their caller had forced",
            (),
        ),
    )

    def __init__(self) -> None:
        self.pipeline: Any | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.pipeline is None:
            return
        (family, kind, documentation, _), replicas, decisions, replayed, resumed = self.FAMILIES
        up = Metric(family, documentation, kind)
        _, down = self.pipeline.health()
        scaling = self.pipeline.scaling()
        standby = self.pipeline.standby
        for group in self.pipeline.topology.processes.values():
            for instance in group.instances:
                if instance in standby:  # an elastic process's replica not running by design: no series
                    continue
                up.add_sample(family, {"process": instance, "group": group.name}, 0.0 if instance in down else 1.0)
        yield up
        count = Metric(replicas[0], replicas[2], replicas[1])
        decided = Metric(decisions[0], decisions[2], decisions[1])
        for name, figures in scaling.items():
            count.add_sample(replicas[0], {"group": name}, float(figures["replicas"]))
            for direction in ("up", "down"):
                decided.add_sample(
                    f"{decisions[0]}_total",
                    {"group": name, "direction": direction},
                    float(figures[f"scaled_{direction}"]),
                )
        yield count
        yield decided
        total = Metric(replayed[0], replayed[2], replayed[1])
        total.add_sample(f"{replayed[0]}_total", {}, float(self.pipeline.replayed))
        yield total
        streams = Metric(resumed[0], resumed[2], resumed[1])
        streams.add_sample(f"{resumed[0]}_total", {}, float(self.pipeline.resumed))
        yield streams


def _quantiles(metric: Metric, name: str, labels: dict[str, str], p50: float | None, p99: float | None) -> None:
    for quantile, value in (("0.5", p50), ("0.99", p99)):
        if value is not None:
            metric.add_sample(name, {**labels, "quantile": quantile}, value)
