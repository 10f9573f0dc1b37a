"""The trace store: JSONL segments in the run directory, bounded in size by rotation.

One batch of events per line (a JSON array of events, each in ``msgspec``'s array form:
``[kind, request_id, stage, process, ts, meta]``), so writing costs one encoder call per
batch. A segment is closed once it passes ``segment_bytes``; only the newest
``max_segments`` are kept, so a run never holds more than about
``segment_bytes * max_segments`` bytes. Writes are flushed as they come (the collector
flushes once per burst of batches), so ``omnictl trace`` can read a run after its server
has stopped, or crashed: a torn last line is skipped.

One request may hold at most ``request_bytes`` of the store (by default 1/32 of the whole,
4 MiB of the default 128 MiB): past it, that request's events are dropped and counted, so a
flood of tiny chunks (each a few events) cannot rotate every other request's trace out. The
events that place and end a request (admitted, first text/audio, completed, failed,
aborted) are always kept, and the trace says what was dropped: ``dropped`` events under the
request's id (meta ``count``, ``share_bytes``), one at the first drop and one with the
rest when the request ends (or the store closes, or stops tracking it); their counts add up.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

import msgspec

from omnictl.profiling.events import Event, EventKind
from omnictl.profiling.rundir import (  # re-exported: the store's public API
    RunInfo,
    TraceError,
    default_run_dir,
    default_runs,
    read_run_info,
    resolve_run_dir,
    write_run_info,
)

__all__ = [
    "RequestSummary",
    "RunInfo",
    "TraceError",
    "TraceStore",
    "default_run_dir",
    "default_runs",
    "find_request",
    "read_run_info",
    "resolve_run_dir",
    "write_run_info",
]

_SEGMENT_GLOB = "events-*.jsonl"
_END_KINDS = {EventKind.COMPLETED: "completed", EventKind.FAILED: "failed", EventKind.ABORTED: "aborted"}
REQUEST_SHARE = 32  # one request may hold 1/REQUEST_SHARE of the store's bytes
# Kept past a request's share: what places it in the list and says how it ended (a few each).
_ALWAYS_KEPT = frozenset({EventKind.ADMITTED, EventKind.FIRST_TEXT, EventKind.FIRST_AUDIO, *_END_KINDS})
_TRACKED_REQUESTS = 4096  # requests whose bytes are counted; the least recently written is forgotten past it
NOTE_PROCESS = "trace_store"  # the process named by the store's own 'dropped' notes


@dataclass(frozen=True)
class RequestSummary:
    request_id: str
    start_ns: int  # admission, or the first event seen when admission was not recorded
    end_ns: int | None  # completion / failure / abort; None while in flight
    status: str  # completed, failed, aborted, in_flight

    @property
    def duration_s(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9


class TraceStore:
    def __init__(
        self,
        run_dir: Path,
        segment_bytes: int = 16 * 1024 * 1024,
        max_segments: int = 8,
        request_bytes: int | None = None,
    ) -> None:
        """``request_bytes``: one request's share (None: the whole's 1/:data:`REQUEST_SHARE`)."""
        if segment_bytes < 1 or max_segments < 1:
            raise ValueError(
                f"TraceStore needs segment_bytes >= 1 and max_segments >= 1, got {segment_bytes}, {max_segments}"
            )
        if request_bytes is not None and request_bytes < 1:
            raise ValueError(f"TraceStore needs request_bytes >= 1, got {request_bytes}")
        self.run_dir = Path(run_dir)
        self.segment_bytes = segment_bytes
        self.max_segments = max_segments
        self.request_bytes = request_bytes or max(1, segment_bytes * max_segments // REQUEST_SHARE)
        # request id -> bytes written of it, least recently written first; and the drops not
        # yet told in a note, per request
        self._written: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._untold: dict[str, int] = {}
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(list[Event])
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._file_bytes = 0

    # -- writing ---------------------------------------------------------------------

    def append(self, events: Sequence[Event], flush: bool = True) -> None:
        """Write ``events`` as one line (flushed unless told otherwise: a caller writing
        many batches at once flushes after the last); rotates segments as they fill."""
        if not events:
            return
        with self._lock:
            lines = self._line(events)
            if lines is None:  # every event was over its request's share
                return
            file = self._file if self._file is not None else self._open_next_segment()
            file.write(lines)
            if flush:
                file.flush()
            self._file_bytes += len(lines)
            if self._file_bytes >= self.segment_bytes:
                file.close()
                self._file = None

    def _line(self, events: Sequence[Event]) -> bytes | None:
        """The batch as one JSON line (an array of events), each request's within its share,
        with the notes of what was dropped; None if nothing of it is kept. Under the lock."""
        parts: list[bytes] = []
        for event in events:
            encoded = self._encoder.encode(event)
            request = event.request_id
            if not request:  # bookkeeping (a recorder's drops): no request's share
                parts.append(encoded)
                continue
            written = self._written.pop(request, 0)
            self._written[request] = written  # now the most recently written
            if written + len(encoded) > self.request_bytes and event.kind not in _ALWAYS_KEPT:
                if request not in self._untold:  # the first drop: the trace says so at once
                    self._untold[request] = 0
                    parts.append(self._note(request, 1, event.ts))
                else:
                    self._untold[request] += 1
                continue
            self._written[request] = written + len(encoded)
            parts.append(encoded)
            if event.kind in _END_KINDS:
                self._forget(request, event.ts, parts)
        while len(self._written) > _TRACKED_REQUESTS:
            self._forget(next(iter(self._written)), events[-1].ts, parts)
        return b"[" + b",".join(parts) + b"]\n" if parts else None

    def _note(self, request: str, count: int, ts: int) -> bytes:
        meta: dict[str, int | float | str | bool | None] = {"count": count, "share_bytes": self.request_bytes}
        return self._encoder.encode(Event(EventKind.DROPPED, request, None, NOTE_PROCESS, ts, meta))

    def _forget(self, request: str, ts: int, parts: list[bytes]) -> None:
        """Stop counting ``request`` (ended, or the least recent of too many), telling the
        drops not told yet."""
        self._written.pop(request, None)
        untold = self._untold.pop(request, 0)
        if untold:
            parts.append(self._note(request, untold, ts))

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            notes: list[bytes] = []
            for request in list(self._untold):
                self._forget(request, time.time_ns(), notes)
            if notes:
                file = self._file if self._file is not None else self._open_next_segment()
                file.write(b"[" + b",".join(notes) + b"]\n")
            if self._file is not None:
                self._file.close()
                self._file = None

    def _open_next_segment(self) -> BinaryIO:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        segments = self.segments()
        number = _segment_number(segments[-1]) + 1 if segments else 1
        for old in segments[: max(0, len(segments) + 1 - self.max_segments)]:
            old.unlink(missing_ok=True)
        self._file = open(self.run_dir / f"events-{number:06d}.jsonl", "ab")
        self._file_bytes = 0
        return self._file

    # -- reading ---------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        return sorted(self.run_dir.glob(_SEGMENT_GLOB), key=_segment_number)

    def size_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.segments())

    def iter_events(self, request_id: str | None = None) -> Iterator[Event]:
        """Every stored event (of one request, if given), in the order written."""
        # The id is a whole array element (`,"id",`): a cheap byte test before decoding.
        needle = b"," + msgspec.json.encode(request_id) + b"," if request_id is not None else None
        wanted = (lambda event: True) if request_id is None else (lambda event: event.request_id == request_id)
        for segment in self.segments():
            try:
                data = segment.read_bytes()
            except FileNotFoundError:  # rotated away while we were reading
                continue
            for line in data.splitlines():
                if needle is not None and needle not in line:
                    continue
                try:
                    batch = self._decoder.decode(line)
                except msgspec.DecodeError:
                    continue  # a torn last line from a process that died mid-write
                yield from filter(wanted, batch)

    def events(self, request_id: str) -> list[Event]:
        """One request's events in time order; empty when the id is unknown."""
        return sorted(self.iter_events(request_id), key=lambda event: event.ts)

    def summaries(self) -> list[RequestSummary]:
        """One summary per request seen, ordered by start time."""
        first: dict[str, int] = {}
        admitted: dict[str, int] = {}
        ended: dict[str, tuple[int, str]] = {}
        turns: dict[str, int] = {}  # a realtime turn's id -> its last milestone; "turn" its status
        requests: set[str] = set()  # ids with any event that is not a turn's milestone
        for event in self.iter_events():
            if not event.request_id:
                continue  # bookkeeping (recorder drops), not a request
            if event.request_id not in first or event.ts < first[event.request_id]:
                first[event.request_id] = event.ts
            if event.kind is EventKind.TURN_MILESTONE:
                turns[event.request_id] = max(event.ts, turns.get(event.request_id, event.ts))
                continue
            requests.add(event.request_id)
            if event.kind is EventKind.ADMITTED:
                admitted[event.request_id] = event.ts
            elif event.kind in _END_KINDS:
                ended[event.request_id] = (event.ts, _END_KINDS[event.kind])
        summaries = []
        for request_id, first_ts in first.items():
            start = admitted.get(request_id, first_ts)
            end, status = ended.get(request_id, (None, "in_flight"))
            if request_id in turns and request_id not in requests:
                end, status = turns[request_id], "turn"
            summaries.append(RequestSummary(request_id, start, end, status))
        return sorted(summaries, key=lambda summary: summary.start_ns)

    def request_ids(self, last: int | None = None, slowest: int | None = None) -> list[tuple[str, float | None]]:
        """``(id, duration_s)`` pairs: the ``last`` N started (newest first), the ``slowest``
        N finished (slowest first), or all (oldest first). Duration is None while in flight."""
        return [(s.request_id, s.duration_s) for s in self.select(last=last, slowest=slowest)]

    def select(self, last: int | None = None, slowest: int | None = None) -> list[RequestSummary]:
        if last is not None and slowest is not None:
            raise ValueError("choose one of last / slowest, not both")
        summaries = self.summaries()
        if last is not None:
            return list(reversed(summaries))[: max(0, last)]
        if slowest is not None:
            finished = [s for s in summaries if s.end_ns is not None]
            finished.sort(key=lambda s: s.end_ns - s.start_ns, reverse=True)  # type: ignore[operator]  # end_ns is set on every request kept above (the filter is not seen by mypy)
            return finished[: max(0, slowest)]
        return summaries


def find_request(request_id: str, runs: Sequence[Path] | None = None) -> tuple[Path, list[Event]] | None:
    """The newest run (of ``runs``, default: the default runs) that recorded ``request_id``.

    ``runs/latest`` is whichever program started last, maybe not the server that answered
    the request; an id names its run by itself.
    """
    for run_dir in default_runs() if runs is None else runs:
        events = TraceStore(run_dir).events(request_id)
        if events:
            return run_dir, events
    return None


def _segment_number(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])
