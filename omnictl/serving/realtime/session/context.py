"""What every part of a realtime session is handed: the server, the pipeline, the client's
event sink, the settings, the conversation, and the session's tasks.

The parts (:mod:`.listening`, :mod:`.transcripts`, :mod:`.replies`, :mod:`.items`,
:mod:`.configure`) are objects, each given this context and the parts it calls, never the
session: the shell (:mod:`.shell`) makes them in that order and is the only module that
knows them all, so no part imports another's caller (``tests/test_layering.py`` holds it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.responses import AudioOut
from omnictl.serving.realtime.session.milestones import TurnClock
from omnictl.serving.realtime.session.settings import Settings
from omnictl.serving.realtime.turns import Conversation, Turn
from omnictl.serving.state import PipelineLike, ServingState

# Entry factories whose topology listens: a streamed input (``input_stream=True``) of the
# microphone's audio asked for the ``transcript`` modality alone is transcribed while it comes,
# each confirmed word a delta (the voice assistant's ``asr``, and the ``asr_stream`` stage alone).
LISTENING_ENTRIES = frozenset(
    {
        "omnictl.models.voice_assistant.stages.preprocessing",
        "omnictl.models.voice_assistant.asr_stream.asr_stream",
    }
)


def listens(topology: object) -> bool:
    """Whether ``topology`` transcribes a streamed input while it comes (its entry is one of
    :data:`LISTENING_ENTRIES` and it has a ``transcript`` terminal)."""
    stages = getattr(topology, "stages", {})
    entry = stages.get(getattr(topology, "entry", None)) if isinstance(stages, dict) else None
    terminals = getattr(topology, "terminals", {})
    return getattr(entry, "factory", None) in LISTENING_ENTRIES and TRANSCRIPT in terminals.values()


@dataclass(eq=False)
class SessionContext:
    state: ServingState
    pipeline: PipelineLike
    sink: Callable[[], Callable[[ev.ServerEvent], None]]  # the session's send, read at each event (it may be swapped)
    model: str
    transport: str = "websocket"
    audio_out: AudioOut | None = None  # None: the answer's audio goes out as events
    traceparent: str | None = None  # the handshake's: every request of the session is its child
    id: str = field(default_factory=lambda: ev.new_id("sess"))
    settings: Settings = field(default_factory=Settings)
    conversation: Conversation = field(default_factory=Conversation)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    transcribing: dict[int, Turn] = field(default_factory=dict)  # spoken items whose audio a transcription holds
    turn_clock: TurnClock | None = None  # the latest turn's milestones (:mod:`.milestones`)

    can_transcribe: bool = field(init=False)  # the topology recognises speech (a transcript terminal)
    listens: bool = field(init=False)  # ... and while it is spoken (:func:`listens`)
    can_answer: bool = field(init=False)  # a text or audio terminal: a 'realtime' session is answered

    def __post_init__(self) -> None:
        serves = capabilities(self.pipeline.topology)
        self.can_transcribe = serves.transcription
        self.can_answer = serves.conversation
        self.listens = self.can_transcribe and listens(self.pipeline.topology)

    def send(self, event: ev.ServerEvent) -> None:
        self.sink()(event)

    def spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def transcriber(self) -> str | None:
        """The topology stage that transcribes the user's audio."""
        terminals = self.pipeline.topology.terminals
        return next((name for name, modality in terminals.items() if modality == TRANSCRIPT), None)

    def turn(self, item_id: str) -> TurnClock:
        """The milestones of the turn whose user item is ``item_id``: the latest turn's, or a new
        one's (which becomes the latest). Mark on it with ``turn(item_id).mark("speech_stopped")``."""
        if self.turn_clock is None or self.turn_clock.id != item_id:
            self.turn_clock = TurnClock(item_id, self.id, self.state.profiler, self.state.metrics.turn)
        return self.turn_clock

    def mark(self, item_id: str, milestone: str, request: str | None = None, at_ns: int | None = None) -> None:
        """Stamp ``milestone`` on the turn ``item_id`` if it is still the latest one."""
        if self.turn_clock is not None and self.turn_clock.id == item_id:
            self.turn_clock.mark(milestone, request=request, at_ns=at_ns)

    def send_transcript(self, item_id: str, heard: Transcript, streamed: str | None = None) -> None:
        """A turn's transcript to the client, then its completed text. ``streamed``: the deltas
        already sent while the user spoke (only what they still lack follows, so the deltas
        add up to the transcript); None: the transcript came whole, as one delta."""
        if streamed is None:
            self.send(ev.TranscriptionDelta(item_id=item_id, content_index=0, delta=heard.text))
        elif heard.text.startswith(streamed) and len(heard.text) > len(streamed):
            self.send(ev.TranscriptionDelta(item_id=item_id, content_index=0, delta=heard.text[len(streamed) :]))
        self.send(
            ev.TranscriptionCompleted(
                item_id=item_id,
                content_index=0,
                transcript=heard.text,
                usage=ev.DurationUsage(seconds=round(heard.duration, 3)),
            )
        )

    def held_bytes(self, buffered: int) -> int:
        """What this session holds: its input buffer (``buffered`` bytes), the conversation's
        audio and text, audio being transcribed."""
        turns = {id(t): t for t in (*self.conversation.turns, *self.transcribing.values())}
        return buffered + sum(
            (t.audio.nbytes if t.audio is not None else 0) + len(t.text or "") for t in turns.values()
        )

    def check_memory(self, buffered: int, adding: int, event_id: str | None) -> None:
        limit = self.state.limits.max_realtime_session_bytes
        held = self.held_bytes(buffered)
        if held + adding > limit:
            raise ev.Refusal(event_id)(
                f"this session holds {held / 2**20:.1f} MiB of audio and text; {adding / 2**20:.1f} MiB more "
                f"would pass its limit of {limit / 2**20:.0f} MiB (wait for transcriptions to finish, or "
                "start a new session)",
                "session_memory_limit",
            )
