"""What every part of a realtime session shares: its state, and the few calls one part makes
into another (declared here, each implemented by the part named beside it).

The session is one object (:class:`~omnictl.serving.realtime.session.RealtimeSession`) made
of parts, each a module of this package read on its own: its settings
(:mod:`.settings`), its input audio with rate, VAD and echo hold (:mod:`.input_audio`),
the conversation items the client handles by id (:mod:`.items`), the transcription of the
user's turns (:mod:`.transcription`), the response lifecycle (:mod:`.lifecycle`) and the
answer started before the turn is confirmed (:mod:`.preempt`). All of them read and write
the state :class:`SessionCore` sets up."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

import numpy as np

from omnictl.inputs import ChatRequest
from omnictl.outputs import TRANSCRIPT, Transcript
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import EchoGuard
from omnictl.serving.realtime.frontend import AudioFrontEnd
from omnictl.serving.realtime.responses import AudioOut, ResponseRun
from omnictl.serving.realtime.session.milestones import TurnClock
from omnictl.serving.realtime.session.settings import Settings
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector
from omnictl.serving.realtime.turns import Conversation, Turn
from omnictl.serving.realtime.vad import SileroModel, TurnDetector
from omnictl.serving.state import PipelineLike, ServingState

if TYPE_CHECKING:
    from omnictl.serving.realtime.session.live import LiveTurn
    from omnictl.serving.realtime.session.preempt import Preempted


@dataclass
class AudioRate:
    """A token bucket of audio seconds: ``burst_s`` at once, then ``speed`` x real time."""

    speed: float
    burst_s: float
    allowance: float = field(init=False)
    _at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.allowance = self.burst_s

    def take(self, seconds: float) -> bool:
        """Whether ``seconds`` of audio may be taken now (and, if so, take them)."""
        now = time.monotonic()
        self.allowance = min(self.burst_s, self.allowance + (now - self._at) * self.speed)
        self._at = now
        if seconds > self.allowance:
            return False
        self.allowance -= seconds
        return True


class SessionCore:
    def __init__(
        self,
        state: ServingState,
        pipeline: PipelineLike,
        send: Callable[[ev.ServerEvent], None],
        model: str,
        silero: Callable[[], SileroModel],
        traceparent: str | None = None,
        intent: str | None = None,
        transport: str = "websocket",
        audio_out: AudioOut | None = None,
    ) -> None:
        self.state, self.pipeline, self.send, self.model = state, pipeline, send, model
        self.transport = transport
        self.audio_out = audio_out  # None: the answer's audio goes out as events
        self.traceparent = traceparent  # the handshake's: every request of the session is its child
        self.id = ev.new_id("sess")
        self.settings = Settings()
        limits = state.limits
        self.conversation = Conversation(max_tokens=limits.max_realtime_conversation_tokens)
        self._audio_rate = AudioRate(limits.realtime_audio_speed, limits.realtime_audio_burst_s)
        self._transcribing: dict[int, Turn] = {}  # spoken items whose audio a transcription holds
        self.buffer = bytearray()  # pcm16 24 kHz, since the last commit or clear
        self.audio_ms = 0.0  # audio appended over the whole session
        self._silero = silero
        self._frontend = AudioFrontEnd()  # decoding and turn detection, state kept across appends
        self._turns: TurnDetector | SemanticTurnDetector | None = None
        self._speech_item: str | None = None
        self.echo = EchoGuard()
        # A browser's WebRTC stack cancels its own echo: the guard is off there unless asked for.
        self.echo.enabled = transport != "webrtc"
        self._held_start: tuple[int, float] | None = None  # speech held for the echo guard: (start ms, at audio ms)
        self.response: tuple[ResponseRun, asyncio.Task[None]] | None = None
        self.turn_clock: TurnClock | None = None  # the latest turn's milestones (:mod:`.milestones`)
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: LiveTurn | None = None  # the turn being transcribed as it is spoken (:mod:`.live`)
        self._preempt: Preempted | None = None  # the answer started at a pause, held (:mod:`.preempt`)
        self._discarding: set[asyncio.Task[None]] = set()  # dropped ones' aborts, awaited (not cancelled) at close
        self.can_transcribe = capabilities(pipeline.topology).transcription
        self.settings.transcription = self.can_transcribe
        if intent == "transcription":
            self.settings.type = "transcription"
        self._reset_vad()

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

    def _send_transcript(self, item_id: str, heard: Transcript, streamed: str | None = None) -> None:
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

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def held_bytes(self) -> int:
        """What this session holds: its input buffer, the conversation's audio and text, audio being transcribed."""
        turns = {id(t): t for t in (*self.conversation.turns, *self._transcribing.values())}
        return len(self.buffer) + sum(
            (t.audio.nbytes if t.audio is not None else 0) + len(t.text or "") for t in turns.values()
        )

    def _check_memory(self, adding: int, event_id: str | None) -> None:
        limit = self.state.limits.max_realtime_session_bytes
        held = self.held_bytes()
        if held + adding > limit:
            raise ev.Refusal(event_id)(
                f"this session holds {held / 2**20:.1f} MiB of audio and text; {adding / 2**20:.1f} MiB more "
                f"would pass its limit of {limit / 2**20:.0f} MiB (wait for transcriptions to finish, or "
                "start a new session)",
                "session_memory_limit",
            )

    # --- one part's calls into another ------------------------------------------------------

    def _reset_vad(self) -> None:
        """Turn detection as the settings say, from a clean state (:mod:`.input_audio`)."""
        raise NotImplementedError

    def _modalities(self, wanted: Sequence[str], param: str, event_id: str | None) -> list[str]:
        """``wanted`` if the topology produces it, else the error naming ``param`` (:mod:`.settings`)."""
        raise NotImplementedError

    def _transcribe(self, turn: Turn) -> None:
        """Transcribe a committed turn, in a task (:mod:`.transcription`)."""
        raise NotImplementedError

    async def _recognise(
        self, audio: np.ndarray, item_id: str, request_id: str
    ) -> tuple[Transcript | None, str | None]:
        """What ``audio`` says, nothing sent: (transcript, None), (None, None) or (None, why) (:mod:`.transcription`)."""
        raise NotImplementedError

    def _heard(self, turn: Turn, heard: Transcript, request_id: str | None, at_ns: int | None = None) -> None:
        """A committed turn's transcript: its text, told to the client (:mod:`.transcription`)."""
        raise NotImplementedError

    def _live_open(self, item_id: str) -> None:
        """Start transcribing the turn ``item_id`` while it is spoken, if the server can (:mod:`.live`)."""
        raise NotImplementedError

    def _live_audio(self, raw: bytes) -> None:
        """Audio appended during a live-transcribed turn (:mod:`.live`)."""
        raise NotImplementedError

    def _live_commit(self, turn: Turn) -> bool:
        """End the committed turn's live transcription; False if it has none (:mod:`.live`)."""
        raise NotImplementedError

    def _live_drop(self) -> None:
        """Abort the live transcription of the cleared turn (:mod:`.live`)."""
        raise NotImplementedError

    def _start_response(self, config: ev.ResponseConfig, event_id: str | None) -> None:
        """Start a response to the conversation, in a task (:mod:`.lifecycle`)."""
        raise NotImplementedError

    def _response_run(
        self, config: ev.ResponseConfig, event_id: str | None, clock: TurnClock | None
    ) -> tuple[ResponseRun, Callable[[Sequence[Turn]], ChatRequest]]:
        """A response not started, and what builds its request (:mod:`.lifecycle`)."""
        raise NotImplementedError

    def _respond(
        self,
        run: ResponseRun,
        build: Callable[[], ChatRequest],
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``run`` becomes the session's response, sent in a task (:mod:`.lifecycle`)."""
        raise NotImplementedError

    def _speech_paused(self, audio_end_ms: int) -> None:
        """Speech paused: the answer starts, held from the client (:mod:`.preempt`)."""
        raise NotImplementedError

    def _preempt_take(self, item_id: str, audio_end_ms: int) -> Preempted | None:
        """The confirmed turn's preemptive answer, if it answered that turn (:mod:`.preempt`)."""
        raise NotImplementedError

    def _preempt_drop(self, why: str) -> None:
        """Drop the preemptive answer everywhere, if there is one (:mod:`.preempt`)."""
        raise NotImplementedError

    def _preempt_release(self, p: Preempted, turn: Turn) -> None:
        """Send the held answer as the confirmed turn's response (:mod:`.preempt`)."""
        raise NotImplementedError

    def _stop_playing(self) -> None:
        """The answer's audio stops playing (:mod:`.lifecycle`)."""
        raise NotImplementedError
