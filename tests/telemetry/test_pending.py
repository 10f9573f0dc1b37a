"""PendingTraces: a request is handed out once its end has had time to gather its stages' events."""

from __future__ import annotations

from omnictl.profiling.events import Event, EventKind
from omnictl.telemetry.pending import PendingTraces

K = EventKind


def ev(kind: EventKind, rid: str, ts: int = 0, stage: str | None = None) -> Event:
    return Event(kind, rid, stage, "p", ts)


def test_a_request_is_handed_out_a_grace_period_after_its_end_with_what_came_meanwhile() -> None:
    pending = PendingTraces(grace_s=1.0)
    pending.add([ev(K.ADMITTED, "a"), ev(K.QUEUE_ENTER, "a", stage="s")], now=10.0)
    assert pending.take_due(now=100.0) == []  # not ended: never due
    pending.add([ev(K.COMPLETED, "a")], now=20.0)
    pending.add([ev(K.STAGE_DONE, "a", stage="s")], now=20.5)  # the stage's last batch, a moment later
    assert pending.take_due(now=20.9) == []
    (finished,) = pending.take_due(now=21.0)
    assert finished.request_id == "a" and [e.kind for e in finished.events] == [
        K.ADMITTED, K.QUEUE_ENTER, K.COMPLETED, K.STAGE_DONE]
    assert len(pending) == 0


def test_late_events_of_a_request_handed_out_are_dropped_not_held_forever() -> None:
    pending = PendingTraces(grace_s=0.0)
    pending.add([ev(K.ADMITTED, "a"), ev(K.FAILED, "a")], now=0.0)
    assert [f.request_id for f in pending.take_due(now=0.0)] == ["a"]
    pending.add([ev(K.STAGE_DONE, "a", stage="s")], now=1.0)
    assert len(pending) == 0


def test_bookkeeping_events_belong_to_no_request() -> None:
    pending = PendingTraces()
    pending.add([ev(K.DROPPED, "")])
    assert len(pending) == 0


def test_bounded_requests_held_and_events_per_request() -> None:
    pending = PendingTraces(grace_s=0.0, max_requests=3, max_events=4)
    for rid in "abcd":
        pending.add([ev(K.ADMITTED, rid)], now=0.0)
    assert len(pending) == 3 and pending.given_up == 1  # "a", the oldest, was given up
    pending.add([ev(K.QUEUE_ENTER, "d", stage="s")] * 5 + [ev(K.ABORTED, "d")], now=0.0)
    (finished,) = pending.take_due(now=0.0)
    assert finished.request_id == "d" and len(finished.events) == 5 and finished.truncated == 2
    assert finished.events[-1].kind is K.ABORTED


def test_at_shutdown_every_ended_request_is_handed_out_at_once() -> None:
    pending = PendingTraces(grace_s=60.0)
    pending.add([ev(K.ADMITTED, "done"), ev(K.COMPLETED, "done"), ev(K.ADMITTED, "running")], now=0.0)
    assert [f.request_id for f in pending.take_ended()] == ["done"]
    assert len(pending) == 1  # still running: not finished, not exported


def test_bounded_events_in_all() -> None:
    pending = PendingTraces(grace_s=0.0, max_total_events=5)
    pending.add([ev(K.ADMITTED, "a"), ev(K.QUEUE_ENTER, "a"), ev(K.ADMITTED, "b"), ev(K.QUEUE_ENTER, "b")], now=0.0)
    pending.add([ev(K.STAGE_DONE, "a"), ev(K.STAGE_DONE, "b"), ev(K.COMPLETED, "b")], now=0.0)
    assert pending.total_events == 6  # the cap, plus an end (always kept)
    (b,) = pending.take_due(now=0.0)
    assert [e.kind for e in b.events] == [K.ADMITTED, K.QUEUE_ENTER, K.COMPLETED]  # the end is always kept
    assert b.truncated == 1  # its STAGE_DONE came past the cap
    assert pending.total_events == 3  # what "a" holds; room again
    pending.add([ev(K.COMPLETED, "a")], now=0.0)
    assert len(pending.take_due(now=0.0)[0].events) == 4 and pending.total_events == 0
