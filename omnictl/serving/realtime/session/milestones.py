"""A realtime turn's milestones: when each step between the end of the user's speech and the
answer's first audio happened, stamped once per turn.

A turn is not a pipeline request: it spans the session's own events (speech stopped, the
commit) and one or more pipeline requests (the transcription, the response). Its
:class:`TurnClock` is keyed by the turn's id, the user item's (the ``item_id`` of
``input_audio_buffer.speech_stopped`` / ``.committed``), and each :meth:`TurnClock.mark`

- records a ``turn_milestone`` profiling event under that id (meta: ``milestone``,
  ``since_stop_s``, ``session``, ``request``, the pipeline request it came from, and
  ``ago_s`` for one marked after it happened: a held answer's, read at its release), so
  ``omnictl trace <item id>`` draws the turn's milestones on one timeline and names the
  requests to trace next;
- observes ``omnictl_realtime_turn_seconds{milestone=...}`` on ``/metrics``: seconds from the
  end of speech (``speech_stopped``; ``turn_confirmed`` where no VAD decided the turn);
- feeds the dashboard's ``turn latency`` p50 / p90 (``first_audio_sent``'s figure).

Whoever sees a milestone marks it: :meth:`TurnClock.mark` ignores a second mark of the same
milestone, so "first token" is simply marked on every token. A preemptive answer dropped
because the user went on speaking is marked ``preemptive_dropped``: the answer's milestones go
with it, and the turn's clock starts again at the next end of speech (the drop stays in the
trace, and its figure on ``/metrics`` is from the pause it answered).

A preemptive answer (:mod:`.preempt`) starts at a pause in speech, ``preempt_ms`` before the
VAD says speech stopped at that same point: ``preempted`` is then the turn's end of speech,
the origin of every figure (the milestones between it and ``speech_stopped``, the answer's
transcript and its request's submission, come before the stop and measure from the pause).
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import Histogram

from omnictl.profiler import EventKind, MetaValue, Profiler

# In the order a turn reaches them.
MILESTONES = (
    "preempted",  # speech paused: the answer started preemptively (sent only once the turn is confirmed)
    "speech_stopped",  # the VAD heard the end of speech
    "turn_confirmed",  # the turn ended: the user item committed (by the VAD or the client)
    "transcript_final",  # the user's words, whole
    "response_started",  # the answer's pipeline request submitted
    "first_token",  # the answer's first text
    "first_clause",  # the answer's first audio out of the pipeline (its first synthesised clause)
    "first_audio_sent",  # that audio handed to the transport (an event, or WebRTC's track)
    "preemptive_dropped",  # a preemptive answer dropped: the user went on speaking
)
DROPPED = "preemptive_dropped"


class TurnClock:
    """The milestones of one turn (monotonic ns), each stamped once; see the module."""

    def __init__(
        self,
        turn_id: str,
        session_id: str,
        profiler: Profiler,
        histogram: Histogram | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.id = turn_id
        self.session_id = session_id
        self.stamps: dict[str, int] = {}
        self.dropped = 0  # preemptive answers dropped in this turn
        self._profiler = profiler
        self._histogram = histogram
        self._clock = clock

    def mark(self, milestone: str, request: str | None = None, at_ns: int | None = None) -> bool:
        """Stamp ``milestone``, unless this turn has it already; True if stamped.
        ``request``: the pipeline request it came from (named in the trace). ``at_ns``: when
        it happened (this clock's monotonic ns), if earlier than now: a held preemptive answer
        is read at its release, but its transcript and first token came before."""
        if milestone not in MILESTONES:
            raise ValueError(f"unknown turn milestone {milestone!r}; one of: {', '.join(MILESTONES)}")
        if milestone in self.stamps and milestone != DROPPED:
            return False
        now = self._clock()
        at = now if at_ns is None or milestone == DROPPED else min(at_ns, now)
        since = (at - self._origin(at)) / 1e9
        meta: dict[str, MetaValue] = {
            "milestone": milestone,
            "since_stop_s": round(since, 6),
            "session": self.session_id,
        }
        if request is not None:
            meta["request"] = request
        if at < now:  # recorded now, it happened then: the trace draws it there
            meta["ago_s"] = round((now - at) / 1e9, 6)
        if milestone == DROPPED:
            self.dropped += 1
            meta["dropped"] = self.dropped
            self.stamps.clear()  # the answer is gone; the next end of speech starts the turn's clock again
        else:
            self.stamps[milestone] = at
        self._profiler.record(EventKind.TURN_MILESTONE, self.id, None, **meta)
        if self._histogram is not None:
            self._histogram.labels(milestone).observe(since)
        return True

    def since_stop_s(self, milestone: str) -> float | None:
        """Seconds from the end of speech to ``milestone``; None until both are stamped."""
        at = self.stamps.get(milestone)
        return None if at is None else (at - self._origin(at)) / 1e9

    def _origin(self, now: int) -> int:
        """The end of speech: the pause a preemptive answer started at, else speech stopped, else
        the turn's first milestone (a commit by hand)."""
        for origin in ("preempted", "speech_stopped"):
            if origin in self.stamps:
                return self.stamps[origin]
        return min(self.stamps.values(), default=now)
