"""Derive one request's spans from its events.

Spans: the request (admitted → completed / failed / aborted); per stage the whole stage,
fan-in wait, unpack (hop received → input rebuilt), queue, build, prefill, decode, and the
phases a scheduler names itself (kind ``compute``, named by the phase); per
edge the hops (sent → received, matched by source and target, stream chunks also by
``seq``); zero-length marks (first text, first audio, first emit, terminal complete,
failure); the underruns of its audio stream (kind ``underrun``: the listener's wait).

A realtime turn is traced by its id (the user item's) the same way: its milestones
(``turn_milestone`` events) become zero-length spans of kind ``milestone``, named by the
milestone, and the turn's span runs from the first to the last; its status is ``turn``.

Guarantees, whatever order the events came in: no span ends before it starts; every span
lies inside its request's span (a span that stuck out, e.g. a stage still working when the
request was aborted, is clipped and says so in ``meta["clipped"]``); a hop starts at its
sender's send and ends at its receiver's receive.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from omnictl.profiling.events import STAGE_KINDS, Event, EventKind, MetaValue

_END_STATUS = {EventKind.COMPLETED: "completed", EventKind.FAILED: "failed", EventKind.ABORTED: "aborted"}
_PAIRS = (
    (EventKind.FANIN_WAIT_START, EventKind.FANIN_WAIT_END, "fanin_wait"),
    (EventKind.BUILD_START, EventKind.BUILD_END, "build"),
    (EventKind.PREFILL_START, EventKind.PREFILL_END, "prefill"),
)
# What ends a queue wait: the scheduler started working on the request.
_QUEUE_EXITS = {
    EventKind.BUILD_START,
    EventKind.PREFILL_START,
    EventKind.COMPUTE_START,
    EventKind.FIRST_EMIT,
    EventKind.DECODE_STEPS,
    EventKind.STAGE_DONE,
}
_MARKS = {
    EventKind.FIRST_TEXT,
    EventKind.FIRST_AUDIO,
    EventKind.FIRST_EMIT,
    EventKind.TERMINAL_COMPLETE,
    EventKind.FAILED,
}


@dataclass(frozen=True)
class Span:
    name: str
    stage: str | None
    process: str
    start_ns: int
    end_ns: int
    kind: str  # request, stage, fanin_wait, unpack, queue, build, prefill, decode, hop, stream, mark
    meta: dict[str, MetaValue] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class RequestTrace:
    request_id: str
    status: str  # completed, failed, aborted, in_flight
    request: Span
    spans: list[Span]  # everything but the request span, by start time
    events: list[Event]  # time order
    stages: list[str]  # in order of first activity
    stage_process: dict[str, str]

    def of_kind(self, *kinds: str) -> list[Span]:
        return [span for span in self.spans if span.kind in kinds]


def build_trace(request_id: str, events: Iterable[Event]) -> RequestTrace:
    """Every span of one request. ``events`` may come in any order; other ids are ignored."""
    ordered = sorted((e for e in events if e.request_id == request_id), key=lambda e: e.ts)
    if not ordered:
        raise ValueError(f"no events for request {request_id!r}")
    request = _request_span(request_id, ordered)
    by_stage: dict[str, list[Event]] = defaultdict(list)
    for event in ordered:
        if event.stage is not None and event.kind in STAGE_KINDS:
            by_stage[event.stage].append(event)
    spans: list[Span] = []
    for stage, stage_events in by_stage.items():
        spans.extend(_stage_spans(stage, stage_events))
    spans.extend(_hop_spans(ordered))
    spans.extend(_marks(ordered))
    spans.extend(_underruns(ordered))
    spans.extend(_milestones(ordered))
    spans = sorted((_clip(span, request) for span in spans), key=lambda s: (s.start_ns, -s.duration_ns))
    return RequestTrace(
        request_id=request_id,
        status=str(request.meta["status"]),
        request=request,
        spans=spans,
        events=ordered,
        stages=list(by_stage),
        stage_process={stage: evs[0].process for stage, evs in by_stage.items()},
    )


def derive_spans(events: Sequence[Event]) -> list[Span]:
    """All spans of every request in ``events``, request spans included."""
    spans: list[Span] = []
    for request_id in dict.fromkeys(e.request_id for e in events if e.request_id):
        trace = build_trace(request_id, events)
        spans.append(trace.request)
        spans.extend(trace.spans)
    return spans


def _request_span(request_id: str, ordered: list[Event]) -> Span:
    admitted = next((e for e in ordered if e.kind is EventKind.ADMITTED), ordered[0])
    if all(e.kind is EventKind.TURN_MILESTONE for e in ordered):  # a realtime turn: its milestones' extent
        return Span(request_id, None, admitted.process, admitted.ts, ordered[-1].ts, "request", {"status": "turn"})
    end = next((e for e in ordered if e.kind in _END_STATUS), None)
    status = _END_STATUS[end.kind] if end is not None else "in_flight"
    end_ns = end.ts if end is not None else ordered[-1].ts
    return Span(
        request_id, None, admitted.process, admitted.ts, max(end_ns, admitted.ts), "request", {"status": status}
    )


def _stage_spans(stage: str, events: list[Event]) -> list[Span]:
    process = events[0].process
    start, end = events[0].ts, events[-1].ts
    spans = [Span(stage, stage, process, start, end, "stage", {})]

    def span(kind: str, begin: int, finish: int | None, **meta: MetaValue) -> Span:
        if finish is None:  # never closed: the stage stopped recording (abort, failure, still running)
            finish, meta = end, {**meta, "open": True}
        return Span(kind, stage, process, begin, max(begin, finish), kind, meta)

    for start_kind, end_kind, kind in _PAIRS:
        opened: deque[Event] = deque()
        for event in events:
            if event.kind is start_kind:
                opened.append(event)
            elif event.kind is end_kind and opened:
                spans.append(span(kind, opened.popleft().ts, event.ts))
        spans.extend(span(kind, e.ts, None) for e in opened)
    for index, event in enumerate(events):
        if event.kind is EventKind.QUEUE_ENTER:
            exit_ts = next((e.ts for e in events[index + 1 :] if e.kind in _QUEUE_EXITS), None)
            spans.append(span("queue", event.ts, exit_ts))
        elif event.kind is EventKind.HOP_RECEIVED:
            source = event.meta.get("source")
            rebuilt = next(
                (
                    e.ts
                    for e in events[index + 1 :]
                    if e.kind is EventKind.INPUT_RECEIVED and e.meta.get("source") == source
                ),
                None,
            )
            if rebuilt is not None:
                spans.append(span("unpack", event.ts, rebuilt, source=source))
    decode = _decode_span(events, span)
    if decode is not None:
        spans.append(decode)
    spans.extend(_compute_spans(stage, process, events, end))
    return spans


def _compute_spans(stage: str, process: str, events: list[Event], end: int) -> list[Span]:
    """The scheduler's named phases: kind "compute", named by the phase (e.g. "synthesis")."""
    opened: dict[str, deque[Event]] = defaultdict(deque)
    spans = []
    for event in events:
        phase = str(event.meta.get("phase", "compute"))
        if event.kind is EventKind.COMPUTE_START:
            opened[phase].append(event)
        elif event.kind is EventKind.COMPUTE_END and opened[phase]:
            begin = opened[phase].popleft().ts
            spans.append(Span(phase, stage, process, begin, max(begin, event.ts), "compute", {"phase": phase}))
    for phase, starts in opened.items():
        spans.extend(
            Span(phase, stage, process, e.ts, max(e.ts, end), "compute", {"phase": phase, "open": True}) for e in starts
        )
    return spans


def _decode_span(events: list[Event], span: Callable[..., Span]) -> Span | None:
    steps = [e for e in events if e.kind in (EventKind.DECODE_STEPS, EventKind.DECODE_TOKEN)]
    if not steps:
        return None
    begin_event = next((e for e in events if e.kind is EventKind.PREFILL_END), None) or next(
        (e for e in events if e.kind is EventKind.BUILD_END), steps[0]
    )
    done = [e.ts for e in events if e.kind is EventKind.STAGE_DONE]
    finish = max([steps[-1].ts, *done])
    step_count = sum(_as_int(e.meta.get("steps", 1)) for e in steps)
    seconds = sum(_as_float(e.meta.get("seconds", 0.0)) for e in steps if e.kind is EventKind.DECODE_STEPS)
    return span("decode", min(begin_event.ts, steps[0].ts), finish, steps=step_count, seconds=seconds)


def _hop_spans(ordered: list[Event]) -> list[Span]:
    """Match sends to receives per (source, target); stream chunks by seq when given."""
    hop_sends: dict[tuple[str, str], deque[Event]] = defaultdict(deque)
    hop_receives: dict[tuple[str, str], deque[Event]] = defaultdict(deque)
    input_receives: dict[tuple[str, str], deque[Event]] = defaultdict(deque)
    stream_sends: dict[tuple[str, str, MetaValue], deque[Event]] = defaultdict(deque)
    stream_receives: dict[tuple[str, str, MetaValue], deque[Event]] = defaultdict(deque)
    for event in ordered:
        here = event.stage or event.process
        if event.kind is EventKind.HOP_SENT:
            hop_sends[(here, str(event.meta.get("target")))].append(event)
        elif event.kind is EventKind.HOP_RECEIVED:
            hop_receives[(str(event.meta.get("source")), here)].append(event)
        elif event.kind is EventKind.INPUT_RECEIVED:
            input_receives[(str(event.meta.get("source")), here)].append(event)
        elif event.kind is EventKind.STREAM_SENT:
            stream_sends[(here, str(event.meta.get("target")), event.meta.get("seq"))].append(event)
        elif event.kind is EventKind.STREAM_RECEIVED:
            stream_receives[(str(event.meta.get("source")), here, event.meta.get("seq"))].append(event)
    spans: list[Span] = []
    for key, sends in hop_sends.items():
        # Without explicit hop_received events, the rebuilt input marks the arrival.
        receives = hop_receives.get(key) or input_receives.get(key) or deque()
        spans.extend(_match(sends, receives, key[0], key[1], "hop"))
    for (src, dst, seq), sends in stream_sends.items():
        spans.extend(_match(sends, stream_receives.get((src, dst, seq), deque()), src, dst, "stream"))
    return spans


def _match(sends: deque[Event], receives: deque[Event], src: str, dst: str, kind: str) -> list[Span]:
    spans = []
    receives = deque(receives)
    for sent in sends:
        # The first receive not before this send; an earlier one belongs to nothing we saw.
        while receives and receives[0].ts < sent.ts:
            receives.popleft()
        received = receives.popleft() if receives else None
        meta: dict[str, MetaValue] = {"src": src, "dst": dst}
        meta.update((key, value) for key, value in sent.meta.items() if key != "target")
        if received is None:
            meta["received"] = False
            end = sent.ts
        else:
            meta["dst_process"] = received.process
            end = received.ts
        spans.append(Span(f"{src} → {dst}", sent.stage, sent.process, sent.ts, end, kind, meta))
    return spans


def _marks(ordered: list[Event]) -> list[Span]:
    return [
        Span(e.kind.value, e.stage, e.process, e.ts, e.ts, "mark", dict(e.meta)) for e in ordered if e.kind in _MARKS
    ]


def _milestones(ordered: list[Event]) -> list[Span]:
    """A realtime turn's milestones, each a zero-length span named by the milestone, where it
    happened (``ago_s`` before it was recorded: a held answer's, recorded at its release), in
    the order they happened."""
    spans = []
    for e in ordered:
        if e.kind is EventKind.TURN_MILESTONE:
            at = e.ts - int(_as_float(e.meta.get("ago_s")) * 1e9)
            spans.append(Span(str(e.meta.get("milestone")), None, e.process, at, at, "milestone", dict(e.meta)))
    return sorted(spans, key=lambda span: span.start_ns)


def _underruns(ordered: list[Event]) -> list[Span]:
    """Each underrun as the wait it was: from when the listener's audio ran out to when the
    late chunk left the server (the event's time)."""
    spans = []
    for e in ordered:
        if e.kind is EventKind.UNDERRUN:
            waited = int(_as_float(e.meta.get("seconds")) * 1e9)
            spans.append(Span("underrun", e.stage, e.process, e.ts - waited, e.ts, "underrun", dict(e.meta)))
    return spans


def _clip(span: Span, request: Span) -> Span:
    start = min(max(span.start_ns, request.start_ns), request.end_ns)
    end = min(max(span.end_ns, start), request.end_ns)
    if (start, end) == (span.start_ns, span.end_ns):
        return span
    return Span(span.name, span.stage, span.process, start, end, span.kind, {**span.meta, "clipped": True})


def _as_int(value: MetaValue) -> int:
    return int(value) if isinstance(value, (int, float)) else 1


def _as_float(value: MetaValue) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0
