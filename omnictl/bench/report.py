"""The bench's results: one JSON document, Rich tables, and a comparison with an earlier run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from omnictl.bench.stats import RequestRecord, continuity_summary, latency_summaries, throughput

FORMAT_VERSION = 2
# One unit throughout, stated in the document itself.
UNITS = {
    "time": "seconds (every duration and latency, per request and summarized)",
    "rtf": (
        "real-time factor: time spent producing audio / audio duration (a transcription: its latency / the "
        "duration of the audio it heard); below 1 is faster than real time, lower is better"
    ),
    "rates": "per second of the measured run (keys ending in _per_s)",
}
ROUTE_LABELS = {  # what the requests were, by --route
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech (pcm, streamed)",
    "transcriptions": "/v1/audio/transcriptions (stream=true)",
}
OTHER_NOTE = "other: time at the stage outside any recorded phase (waiting for stream input, routing, sending)"
SILENT_NOTE = (
    "completed without audio: asked for audio, the model spoke none (its audio terminal answered 0 samples; "
    "not counted in the first-audio figures); omnictl trace ID shows where it ended"
)
RTF_NOTE = (
    "real-time factor (RTF) = time spent producing audio ÷ the audio's duration "
    "(a transcription: its latency ÷ the duration of the audio it heard): "
    "below 1 is faster than real time; lower is better"
)
LATENCIES = {  # key: (label, unit: "ms" or "x")
    "ttft": ("time to first text", "ms"),
    "ttfa": ("time to first audio", "ms"),
    "itl": ("inter-token latency", "ms"),
    "e2e": ("end-to-end latency", "ms"),
    "rtf": ("real-time factor", "x"),
    "largest_underrun": ("largest underrun", "ms"),
    "chunk_interval": ("audio chunk interval", "ms"),
}
_COMPARABLE = ("target", "route", "concurrency", "rate", "num_requests", "input_kind", "modalities", "max_tokens")
THROUGHPUT = {  # key: label; higher is better
    "requests_per_s": "requests/s",
    "output_tokens_per_s": "output tokens/s",
    "audio_seconds_per_s": "audio seconds/s",
}


def build_result(
    config: dict[str, Any],
    records: list[RequestRecord],
    duration: float,
    breakdown: dict[str, Any] | None,
    slo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from omnictl import __version__

    completed = sum(r.ok for r in records)
    overloaded = sum(r.overloaded for r in records)
    # A request that asked for audio can complete with none (Qwen3-Omni's talker may pick its
    # end code first: code2wav answers 0 samples). It is a completion, but not one with audio:
    # counted and named here, so the first-audio figures' n is explained, not silently short.
    route = config.get("route") or "chat"  # results written before the bench had routes drove chat
    asked_audio = route == "speech" or (route == "chat" and "audio" in (config.get("modalities") or ()))
    silent = [r.request_id or f"#{r.index}" for r in records if asked_audio and r.ok and r.audio_seconds <= 0]
    return {
        "omnictl_bench": FORMAT_VERSION,
        "omnictl_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "units": UNITS,
        "config": json.loads(json.dumps(config)),  # as it will read back from the file (tuples become lists)
        "summary": {
            "sent": len(records),
            "completed": completed,
            "failed": len(records) - completed - overloaded,
            "overloaded": overloaded,  # 429s: admission control shed them; counted apart from failures
            "completed_without_audio": len(silent),  # asked for audio, completed with none
            "without_audio": silent,  # their request ids (omnictl trace ID shows where the audio ended)
            "goodput": completed / duration if duration > 0 else 0.0,  # completed requests per second
            "duration_s": duration,
            **throughput(records, duration),
        },
        "latency": {key: summary.as_dict() for key, summary in latency_summaries(records).items()},
        "continuity": continuity_summary(records),
        "slo": slo,
        "breakdown": breakdown or {"source": None, "stages": {}, "edges": {}},
        "errors": sorted({r.error for r in records if r.error}),
        "requests": [r.as_dict() for r in records],
    }


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable bench result: {exc}") from exc
    if not isinstance(data, dict) or data.get("omnictl_bench") != FORMAT_VERSION:
        raise ValueError(f"{path}: not an omnictl bench result (missing 'omnictl_bench': {FORMAT_VERSION})")
    return data


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f}" if unit == "ms" else f"{value:.3f}"


def render(result: dict[str, Any]) -> Group:
    summary = result["summary"]
    head = Table(title="omnictl bench", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column(justify="right")
    head.add_row("target", str(result["config"].get("target", "")))
    head.add_row("route", ROUTE_LABELS.get(result["config"].get("route") or "chat", "?"))
    head.add_row("completed / failed", f"{summary['completed']} / {summary['failed']}")
    head.add_row("refused (429, overloaded)", str(summary.get("overloaded", 0)))
    if summary.get("completed_without_audio"):  # absent from results written before it was counted
        head.add_row("completed without audio", str(summary["completed_without_audio"]))
    head.add_row("goodput (completed/s)", f"{summary.get('goodput', 0.0):.2f}")
    head.add_row("duration", f"{summary['duration_s']:.2f} s")
    for key, label in THROUGHPUT.items():
        head.add_row(label, f"{summary[key]:.2f}")

    latency = Table(title="latency", title_justify="left")
    for column in ("metric", "unit", "n", "mean", "p50", "p90", "p99"):
        latency.add_column(column, justify="left" if column in ("metric", "unit") else "right")
    for key, (label, unit) in LATENCIES.items():
        s = result["latency"].get(key)
        if s is None:  # a result written before this figure existed
            continue
        latency.add_row(label, unit, str(s["count"]), *(_fmt(s[q], unit) for q in ("mean", "p50", "p90", "p99")))

    parts: list[Any] = [head, latency, Text(RTF_NOTE, style="dim")]
    if summary.get("completed_without_audio"):
        ids = summary["without_audio"]
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        parts.append(Text(f"{SILENT_NOTE}: {shown}", style="yellow"))
    parts += _continuity_parts(result)
    breakdown = result["breakdown"]
    if breakdown.get("stages"):
        source = (
            "the server's /metrics: p50/p99 over its profiler window, n since it started"
            if breakdown["source"] == "metrics"
            else "the trace store: exactly the measured requests"
        )
        stages = Table(title="per-stage time (ms)", title_justify="left")
        for column in ("stage", "n", "mean", "p50", "p90", "p99"):
            stages.add_column(column, justify="left" if column == "stage" else "right", no_wrap=column == "stage")
        for name, s in breakdown["stages"].items():
            stages.add_row(
                name, str(s.get("count", "-")), *(_fmt(s.get(q), "ms") for q in ("mean", "p50", "p90", "p99"))
            )
        parts += [stages, Text(f"from {source}", style="dim")]
        split = _parts_table(breakdown["stages"])
        if split is not None:
            parts += [split, Text(OTHER_NOTE, style="dim")]
    if breakdown.get("edges"):
        edges = Table(title="per-edge hop latency (ms)", title_justify="left")
        for column in ("edge", "n", "mean", "p50", "p90", "p99"):
            edges.add_column(column, justify="left" if column == "edge" else "right")
        for name, s in breakdown["edges"].items():
            edges.add_row(
                name, str(s.get("count", "-")), *(_fmt(s.get(q), "ms") for q in ("mean", "p50", "p90", "p99"))
            )
        parts.append(edges)
    if result["errors"]:
        errors = Table(title="errors", title_justify="left", show_header=False)
        errors.add_column()
        for error in result["errors"][:10]:
            errors.add_row(error)
        parts.append(errors)
    return Group(*parts)


CONTINUITY_NOTE = (
    "underrun: the wait of a listener playing the audio in real time from its first chunk's "
    "arrival (the bench's own receive clock) for the next chunk"
)


def _continuity_parts(result: dict[str, Any]) -> list[Any]:
    continuity = result.get("continuity") or {}
    parts: list[Any] = []
    if continuity.get("streams"):
        table = Table(title="audio continuity (client clock)", title_justify="left")
        for column in ("threshold", "gaps over it", "streams within it"):
            table.add_column(column, justify="left" if column == "threshold" else "right")
        for ms, gaps in continuity["gaps_over_ms"].items():
            share = continuity["continuity"][ms]
            table.add_row(f"{ms} ms", str(gaps), "-" if share is None else f"{share:.0%}")
        parts += [table, Text(CONTINUITY_NOTE, style="dim")]
    slo = result.get("slo")
    if slo:
        goals = []
        if slo.get("ttfp_s") is not None:
            goals.append(f"first audio <= {slo['ttfp_s'] * 1000:g} ms")
        if slo.get("underrun_s") is not None:
            goals.append(f"largest underrun <= {slo['underrun_s'] * 1000:g} ms")
        table = Table(title=f"audio SLO: {' and '.join(goals)}", title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("met", f"{slo['met']} ({slo['share']:.0%})")
        table.add_row("goodput (met/s)", f"{slo['goodput_per_s']:.2f}")
        for reason, count in sorted(slo.get("missed_by", {}).items()):
            table.add_row(f"missed: {reason}", str(count))
        parts.append(table)
        missed = [m for m in slo.get("missed", []) if m.get("request_id")]
        if missed:
            late = Table(title="missed requests: where the late chunk waited", title_justify="left")
            for column in ("request", "missed", "stage", "part", "ms"):
                late.add_column(column, justify="right" if column == "ms" else "left", no_wrap=column != "request")
            for miss in missed[:10]:
                seconds = miss.get("seconds")
                late.add_row(
                    str(miss["request_id"]),
                    miss["reason"],
                    miss.get("stage") or "-",
                    miss.get("part") or "-",
                    "-" if seconds is None else f"{seconds * 1000:.1f}",
                )
            parts.append(late)
    return parts


def _parts_table(stages: dict[str, Any]) -> Table | None:
    """Where each stage's time goes: one row per part, so it reads at any width."""
    table = Table(title="per-stage parts (mean ms)", title_justify="left")
    for column in ("stage", "part", "mean", "of stage"):
        table.add_column(column, justify="left" if column in ("stage", "part") else "right", no_wrap=True)
    rows = 0
    for name, s in stages.items():
        mean = s.get("mean")
        for index, (part, seconds) in enumerate(s.get("parts", {}).items()):
            share = f"{seconds / mean:.0%}" if mean else "-"
            table.add_row(name if index == 0 else "", part, _fmt(seconds, "ms"), share)
            rows += 1
    return table if rows else None


def _change(old: float | None, new: float | None, higher_is_better: bool, decimals: int) -> tuple[str, str]:
    if old is None or new is None:
        return "-", "-"
    delta = new - old
    percent = f"{delta / old * 100:+.1f}%" if old else "-"
    better = delta > 0 if higher_is_better else delta < 0
    style = "green" if better and delta else ("red" if delta else "")
    text = f"{delta:+.{decimals}f}"
    return (f"[{style}]{text}[/]" if style else text), percent


def compare(old: dict[str, Any], new: dict[str, Any]) -> Table:
    """Differences new − old; green where the new run is better, red where worse."""
    table = Table(title="compared with the earlier run", title_justify="left")
    for column in ("figure", "old", "new", "change", "change %"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for key, label in THROUGHPUT.items():
        o, n = old["summary"].get(key), new["summary"].get(key)
        table.add_row(label, _fmt(o, "x"), _fmt(n, "x"), *_change(o, n, higher_is_better=True, decimals=3))
    for key, (label, unit) in LATENCIES.items():
        for q in ("mean", "p50", "p99"):
            o, n = old["latency"].get(key, {}).get(q), new["latency"].get(key, {}).get(q)
            if o is None and n is None:
                continue
            scale = 1000 if unit == "ms" else 1
            o_s = None if o is None else o * scale
            n_s = None if n is None else n * scale
            table.add_row(
                f"{label} {q} ({unit})",
                _fmt(o, unit),
                _fmt(n, unit),
                *_change(o_s, n_s, higher_is_better=False, decimals=1 if unit == "ms" else 3),
            )
    for key in ("completed", "failed"):
        o, n = old["summary"][key], new["summary"][key]
        table.add_row(key, str(o), str(n), f"{n - o:+d}", "-")

    def setting(result: dict[str, Any], key: str) -> Any:
        value = result["config"].get(key)
        return value or "chat" if key == "route" else value  # a run from before routes drove chat

    differing = sorted(k for k in _COMPARABLE if setting(old, k) != setting(new, k))
    if differing:
        table.caption = f"note: the runs differ in {', '.join(differing)}"
    return table


def print_result(result: dict[str, Any], console: Console, previous: dict[str, Any] | None = None) -> None:
    console.print(render(result))
    if previous is not None:
        console.print(compare(previous, result))
