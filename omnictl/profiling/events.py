"""Profiling events: small, typed, never carrying tensors.

Timestamps are ``time.time_ns()``: wall-clock nanoseconds, comparable across the
processes of one host.
"""

from __future__ import annotations

import enum
import time
from typing import Protocol, Union

import msgspec

MetaValue = Union[int, float, str, bool, None]


class EventKind(str, enum.Enum):
    ADMITTED = "admitted"  # coordinator accepted the request
    INPUT_RECEIVED = "input_received"  # a stage got an input (meta: source, bytes, transport)
    FANIN_WAIT_START = "fanin_wait_start"
    FANIN_WAIT_END = "fanin_wait_end"
    QUEUE_ENTER = "queue_enter"  # handed to the scheduler's inbox
    BUILD_START = "build_start"  # scheduler builds model inputs
    BUILD_END = "build_end"
    PREFILL_START = "prefill_start"
    PREFILL_END = "prefill_end"
    FIRST_EMIT = "first_emit"  # first stream chunk or result left the scheduler
    DECODE_STEPS = "decode_steps"  # aggregated: meta steps, seconds
    DECODE_TOKEN = "decode_token"  # one per token, only when asked for
    # A phase of work the scheduler names itself (meta: phase), e.g. a TTS's "synthesis":
    # what it does that is neither build, prefill nor decode.
    COMPUTE_START = "compute_start"
    COMPUTE_END = "compute_end"
    STREAM_SENT = "stream_sent"  # meta: target, seq, bytes, transport
    STREAM_RECEIVED = "stream_received"  # meta: source, seq
    HOP_SENT = "hop_sent"  # meta: target, bytes, transport
    HOP_RECEIVED = "hop_received"  # meta: source, transport
    STAGE_DONE = "stage_done"  # the scheduler returned this request's result at a stage
    TERMINAL_COMPLETE = "terminal_complete"  # a terminal stage reported to the coordinator
    FIRST_TEXT = "first_text"
    FIRST_AUDIO = "first_audio"
    COMPLETED = "completed"
    FAILED = "failed"  # meta: stage, error
    # The server sent an audio chunk after the listener's audio had run out (meta: seconds
    # the listener waited, chunk: the late chunk's index, endpoint); recorded as it leaves.
    UNDERRUN = "underrun"
    ABORTED = "aborted"
    # A stage dropped what it held for a request on the coordinator's abort (a stage that
    # never saw the request records nothing): the abort's arrival, stage by stage.
    STAGE_ABORTED = "stage_aborted"
    # A realtime turn's milestone (meta: milestone, since_stop_s, session, request, and ago_s
    # when it happened that long before it was recorded): recorded by
    # the server under the turn's id (the user item's), not a pipeline request's; see
    # omnictl.serving.realtime.session.milestones.
    TURN_MILESTONE = "turn_milestone"
    # Bookkeeping, not about one request: a recorder's drops since its previous batch
    # (meta: count). request_id is "" and stage is None.
    DROPPED = "dropped"


# Recorded by a stage's own process about its own work (the rest come from the coordinator,
# which names the terminal stage in `stage` for terminal_complete / first_text / failed...).
STAGE_KINDS = frozenset(
    {
        EventKind.HOP_RECEIVED,
        EventKind.INPUT_RECEIVED,
        EventKind.STREAM_RECEIVED,
        EventKind.FANIN_WAIT_START,
        EventKind.FANIN_WAIT_END,
        EventKind.QUEUE_ENTER,
        EventKind.BUILD_START,
        EventKind.BUILD_END,
        EventKind.PREFILL_START,
        EventKind.PREFILL_END,
        EventKind.FIRST_EMIT,
        EventKind.DECODE_STEPS,
        EventKind.DECODE_TOKEN,
        EventKind.COMPUTE_START,
        EventKind.COMPUTE_END,
        EventKind.STREAM_SENT,
        EventKind.HOP_SENT,
        EventKind.STAGE_DONE,
    }
)


class Event(msgspec.Struct, array_like=True, frozen=True, gc=False):
    # gc=False: events never form reference cycles; untracked, they cost the collector nothing.
    kind: EventKind
    request_id: str
    stage: str | None
    process: str
    ts: int  # time.time_ns()
    meta: dict[str, MetaValue] = {}


class Profiler(Protocol):
    """What stages, schedulers and the coordinator call. Never raises, never blocks."""

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: MetaValue) -> None: ...


class NullProfiler:
    """Records nothing: the default until a real recorder is attached."""

    def record(self, kind: EventKind, request_id: str, stage: str | None = None, **meta: MetaValue) -> None:
        return None


def now_ns() -> int:
    return time.time_ns()
