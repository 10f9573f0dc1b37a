"""Turn-taking: who has the floor in a realtime session, as one pure state machine.

:class:`TurnTaking` takes what happened — the turn detector's events (speech started,
paused, resumed, stopped), the client's events (a commit, a clear, ``response.create``,
``response.cancel``, ``output_audio_buffer.clear``, anything else it does), and the
completions of the work it asked for (a response started or done, its audio heard to the
end) — and returns what to do about it, as a list of effects. It runs no task, reads no
clock, sends nothing and awaits nothing, so every ordering rule of the conversation is a
row of a table in ``tests/serving/realtime/test_turn_taking.py``; the session
(:mod:`omnictl.serving.realtime.session`) is the shell that feeds it, one event at a time
in the order they happened, and carries out what it returns, as
:class:`~omnictl.coordinator.core.CoordinatorCore` is fed by its coordinator.

Two regions, each one explicit state (drawn in ``docs/serving.md``):

- :class:`Listening` — the user's side: ``IDLE`` (no user turn open), ``SPEAKING`` (a turn
  open: speech the detector heard start, or audio appended with turn detection off),
  ``PAUSED`` (speech paused; the detector has not decided whether the turn ended).
- :class:`Reply` — the assistant's side: ``NONE``, ``HELD`` (an early answer started at the
  pause, held from the client until the turn is confirmed), ``RESPONDING`` (a response
  streaming), ``CANCELLING`` (cancelled, its ``response.done`` not yet sent),
  ``PLAYING_OUT`` (its ``response.done`` sent while its audio still plays on a track the
  server drives: a WebRTC call). A reply lives until it has been heard: speech over it
  clears the track and cuts the item to what was heard, whether or not it is still being
  generated — and so does speech over a later reply that started while it still played
  (``TurnTaking.playing``: every reply done generating and not yet heard, whatever the
  region's state).

The effects name what to do, never how: the shell's code for each is one branch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Union

MIN_PREEMPT_MS = 100  # less audio than a commit takes (MIN_COMMIT_MS) is not answered early


class Listening(enum.Enum):
    IDLE = "idle"
    SPEAKING = "speaking"
    PAUSED = "paused"


class Reply(enum.Enum):
    NONE = "none"
    HELD = "held"
    RESPONDING = "responding"
    CANCELLING = "cancelling"
    PLAYING_OUT = "playing_out"


@dataclass(frozen=True)
class Policy:
    """What the session's settings say about turns (the shell builds it from them)."""

    detects_turns: bool = True  # server or semantic VAD; False: the client commits turns
    create_response: bool = True  # a detected turn's end starts a response
    interrupt_response: bool = True  # speech over a reply stops it (barge-in)
    answers: bool = True  # a 'realtime' session; False: a 'transcription' one (never answers)
    live: bool = False  # turns are transcribed while spoken (an early answer starts from that transcript)


# --- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeechStarted:
    audio_ms: int


@dataclass(frozen=True)
class SpeechPaused:
    audio_ms: int
    buffered_ms: float  # audio the turn holds so far


@dataclass(frozen=True)
class SpeechResumed:
    audio_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_ms: int


@dataclass(frozen=True)
class AudioIn:
    """Audio appended while turn detection is off: the first opens the user's turn."""


@dataclass(frozen=True)
class Commit:
    """``input_audio_buffer.commit``."""


@dataclass(frozen=True)
class CommitFailed:
    """The shell could not commit the turn ``item_id`` (too little audio, memory)."""

    item_id: str


@dataclass(frozen=True)
class Clear:
    """``input_audio_buffer.clear``."""


@dataclass(frozen=True)
class Configured:
    """``session.update`` applied. ``turn_detection``: it set turn detection (the detector
    starts again from a clean state)."""

    policy: Policy
    turn_detection: bool = False


@dataclass(frozen=True)
class ClientActed:
    """Any other client event that changes the conversation (an item created, truncated,
    deleted): an answer started at a pause would answer a conversation no longer there."""

    what: str


@dataclass(frozen=True)
class Drop:
    """Whatever else makes the held early answer wrong (``why``: the log's words)."""

    why: str


@dataclass(frozen=True)
class ResponseCreate:
    """``response.create``."""


@dataclass(frozen=True)
class ResponseCancel:
    """``response.cancel`` (``response_id``: the one it names, if it names one)."""

    response_id: str | None = None


@dataclass(frozen=True)
class OutputAudioClear:
    """``output_audio_buffer.clear``."""


@dataclass(frozen=True)
class ResponseStarted:
    """The shell made ``response_id`` the session's response (``early``: the held one released)."""

    response_id: str


@dataclass(frozen=True)
class ResponseDone:
    """``response.done`` of ``response_id`` was sent. ``playing``: its audio still plays on
    the track the server drives (WebRTC), until :class:`PlayoutFinished`."""

    response_id: str
    playing: bool = False


@dataclass(frozen=True)
class EarlyAnswerReady:
    """The early answer released to the turn ``item_id`` is ready: its start at the pause ran to
    its end, failed, or was cancelled with its response. ``heard``: it transcribed the turn."""

    item_id: str
    heard: bool


@dataclass(frozen=True)
class PlayoutFinished:
    """The track played ``response_id``'s audio to its end (or dropped it)."""

    response_id: str


@dataclass(frozen=True)
class Closed:
    """The transport closed."""


Event = Union[
    SpeechStarted,
    SpeechPaused,
    SpeechResumed,
    SpeechStopped,
    AudioIn,
    Commit,
    CommitFailed,
    Clear,
    Configured,
    ClientActed,
    Drop,
    ResponseCreate,
    ResponseCancel,
    OutputAudioClear,
    ResponseStarted,
    ResponseDone,
    EarlyAnswerReady,
    PlayoutFinished,
    Closed,
]

# --- effects ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenTurn:
    """A user turn opens as item ``item_id``: say ``speech_started`` (``announce``) and
    transcribe it while spoken, if the server can."""

    item_id: str
    audio_ms: int
    announce: bool = True


@dataclass(frozen=True)
class DropTurn:
    """The turn ``item_id``, opened by audio alone while turn detection was off, ends
    uncommitted now that it is on: its live transcription is dropped. A turn is then what the
    detector hears (its start opens one, announced, barging in; the buffer is trimmed to the
    prefix padding meanwhile), not everything appended since the last commit."""

    item_id: str


@dataclass(frozen=True)
class Interrupt:
    """Barge-in: the reply ``response_id`` stops playing and is cancelled (``turn_detected``)."""

    response_id: str


@dataclass(frozen=True)
class ClearPlayout:
    """The reply ``response_id``, generated but still playing, stops: the track drops what it
    holds (``output_audio_buffer.cleared``) and its item is cut to what was heard."""

    response_id: str


@dataclass(frozen=True)
class StartEarlyAnswer:
    """Start answering the turn ``item_id`` as it is at ``audio_ms``, held from the client."""

    item_id: str
    audio_ms: int


@dataclass(frozen=True)
class DropEarlyAnswer:
    item_id: str
    why: str


@dataclass(frozen=True)
class EndSpeech:
    """Say ``speech_stopped`` for the turn ``item_id``."""

    item_id: str
    audio_ms: int


@dataclass(frozen=True)
class CommitTurn:
    """The buffer becomes the user item ``item_id``; transcribed unless ``transcribe`` is
    False (the held answer heard it). ``end_detector_turn``: the client ended a turn the
    detector is in (it must not commit the silence after it as another)."""

    item_id: str
    transcribe: bool = True
    end_detector_turn: bool = False


@dataclass(frozen=True)
class ReleaseEarlyAnswer:
    """The held answer to ``item_id`` goes out as the session's response."""

    item_id: str


@dataclass(frozen=True)
class AdoptTranscript:
    """The turn ``item_id``'s transcript is the one its early answer heard at the pause: it is
    not decoded again (its live transcription, if any, is aborted)."""

    item_id: str


@dataclass(frozen=True)
class TranscribeTurn:
    """The turn ``item_id`` is transcribed now, as any committed turn: its early answer did not
    hear it (its transcription failed, or it was cancelled first)."""

    item_id: str


@dataclass(frozen=True)
class StartResponse:
    """A response to the conversation (at once: a cancelled one's ``response.done`` went out first)."""


@dataclass(frozen=True)
class CancelResponse:
    response_id: str
    reason: str = "client_cancelled"


@dataclass(frozen=True)
class ClearInput:
    """The input buffer, the turn's live transcription and the detector start again."""


@dataclass(frozen=True)
class Refuse:
    """The client event cannot be done now: an ``error`` event saying so."""

    message: str
    code: str
    param: str | None = None


@dataclass(frozen=True)
class AwaitDrops:
    """Before anything of the session is cancelled: every dropped answer's abort finishes."""


Effect = Union[
    OpenTurn,
    DropTurn,
    Interrupt,
    ClearPlayout,
    StartEarlyAnswer,
    DropEarlyAnswer,
    EndSpeech,
    CommitTurn,
    ReleaseEarlyAnswer,
    AdoptTranscript,
    TranscribeTurn,
    StartResponse,
    CancelResponse,
    ClearInput,
    Refuse,
    AwaitDrops,
]


@dataclass
class _Early:
    item_id: str
    audio_ms: int  # where the speech paused: the turn is this one only if it stops there


@dataclass(frozen=True)
class _Committing:
    """The turn a :class:`CommitTurn` just ended, as it was: a refused commit gives it back."""

    item_id: str
    listening: Listening
    announced: bool
    client: bool  # the client's commit (refused: the turn goes on); else the detector's stop


@dataclass
class TurnTaking:
    """The session's turn-taking state; :meth:`handle` is every transition."""

    policy: Policy = field(default_factory=Policy)
    new_id: Callable[[], str] = field(default=lambda: "")  # a new user item id
    listening: Listening = Listening.IDLE
    reply: Reply = Reply.NONE
    item_id: str | None = None  # the open user turn's item (SPEAKING / PAUSED)
    announced: bool = False  # the open turn is one the detector heard start (speech_started said)
    response_id: str | None = None  # the reply generating (RESPONDING / CANCELLING)
    # Replies done generating whose audio still plays (WebRTC), oldest first: PLAYING_OUT when
    # nothing else is held or generating, and still there behind a later reply until heard.
    playing: list[str] = field(default_factory=list)
    early: _Early | None = None  # the held early answer (HELD)
    start_after_cancel: bool = False  # a turn ended while its barge-in's response was cancelling
    closed: bool = False
    committing: _Committing | None = None  # the last CommitTurn's turn, until the next event
    released: set[str] = field(default_factory=set)  # turns whose released early answer is not ready yet

    def handle(self, event: Event) -> list[Effect]:
        """What ``event`` changes, and what the shell must do, in order."""
        if self.closed:
            return []
        committing, self.committing = self.committing, None  # a CommitFailed follows its CommitTurn at once
        out: list[Effect] = []
        if isinstance(event, SpeechStarted):
            self._speech_started(event, out)
        elif isinstance(event, SpeechPaused):
            self._speech_paused(event, out)
        elif isinstance(event, SpeechResumed):
            if self.listening is Listening.PAUSED:
                self.listening = Listening.SPEAKING
            self._drop("the user went on speaking", out)
        elif isinstance(event, SpeechStopped):
            self._speech_stopped(event, out)
        elif isinstance(event, AudioIn):
            if self.listening is Listening.IDLE and not self.policy.detects_turns:
                self._open(0, False, out)
        elif isinstance(event, Commit):
            self._commit(out)
        elif isinstance(event, CommitFailed):
            self._drop("the turn could not be committed", out)
            if committing is not None and committing.item_id == event.item_id:
                self._commit_failed(committing, out)
            self.released.discard(event.item_id)  # never released: the commit it followed failed
        elif isinstance(event, Clear):
            self._drop("the client sent input_audio_buffer.clear", out)
            self.listening, self.item_id = Listening.IDLE, None
            out.append(ClearInput())
        elif isinstance(event, Configured):
            self._drop("the client sent session.update", out)
            self.policy = event.policy
            # The detector starts again, but the user has not stopped: the turn open goes on
            # under its item id (its live transcript too), whatever the new detector says.
            if event.turn_detection and self.listening is Listening.PAUSED:
                self.listening = Listening.SPEAKING
            # A turn opened by audio alone is no speech heard: with a detector now, it is not one.
            if event.turn_detection and self.policy.detects_turns and self.item_id is not None and not self.announced:
                out.append(DropTurn(self.item_id))
                self.listening, self.item_id = Listening.IDLE, None
        elif isinstance(event, ClientActed):
            self._drop(f"the client sent {event.what}", out)
        elif isinstance(event, Drop):
            self._drop(event.why, out)
        elif isinstance(event, ResponseCreate):
            self._drop("the client sent response.create", out)
            if not self.policy.answers:
                out.append(
                    Refuse(
                        "response.create: a transcription session only transcribes; open a 'realtime' session for answers",
                        "invalid_request",
                        "type",
                    )
                )
            elif self.reply in (Reply.RESPONDING, Reply.CANCELLING):
                out.append(
                    Refuse(
                        f"response {self.response_id} is still in progress; cancel it or wait for response.done",
                        "conversation_already_has_active_response",
                    )
                )
            else:
                out.append(StartResponse())
        elif isinstance(event, ResponseCancel):
            self._drop("the client sent response.cancel", out)
            self._cancel(event.response_id, out)
        elif isinstance(event, OutputAudioClear):
            self._drop("the client sent output_audio_buffer.clear", out)
            self.playing = []  # the track (or the client) drops every reply's audio
            if self.reply is Reply.RESPONDING and self.response_id is not None:
                self.reply = Reply.CANCELLING
                out.append(CancelResponse(self.response_id))
            elif self.reply is Reply.PLAYING_OUT:
                self.reply = Reply.NONE
        elif isinstance(event, ResponseStarted):
            self.reply, self.response_id, self.early = Reply.RESPONDING, event.response_id, None
        elif isinstance(event, ResponseDone):
            self._response_done(event, out)
        elif isinstance(event, EarlyAnswerReady):
            if event.item_id in self.released:  # once, for a turn released (not a stale one's)
                self.released.discard(event.item_id)
                out.append(AdoptTranscript(event.item_id) if event.heard else TranscribeTurn(event.item_id))
        elif isinstance(event, PlayoutFinished):
            if event.response_id in self.playing:
                self.playing.remove(event.response_id)
            if self.reply is Reply.PLAYING_OUT and not self.playing:
                self.reply = Reply.NONE
        elif isinstance(event, Closed):
            self._drop("the session closed", out)
            out.append(AwaitDrops())
            if self.reply in (Reply.RESPONDING, Reply.CANCELLING) and self.response_id is not None:
                out.append(CancelResponse(self.response_id))
            self.playing = []
            self.closed = True
        return out

    # --- the user's side ------------------------------------------------------------------

    def _open(self, audio_ms: int, announce: bool, out: list[Effect]) -> None:
        self.listening, self.item_id, self.announced = Listening.SPEAKING, self.new_id(), announce
        out.append(OpenTurn(self.item_id, audio_ms, announce))

    def _speech_started(self, event: SpeechStarted, out: list[Effect]) -> None:
        if self.listening is not Listening.IDLE:
            # A detector started again (session.update) while the user speaks on: one turn.
            self.listening = Listening.SPEAKING
            return
        self._open(event.audio_ms, True, out)
        if not self.policy.interrupt_response:
            return
        # Done generating, not done playing: they stop all the same, oldest first (cut to what was heard).
        out.extend(ClearPlayout(response_id) for response_id in self.playing)
        self.playing = []
        if self.reply is Reply.RESPONDING and self.response_id is not None:
            self.reply = Reply.CANCELLING
            out.append(Interrupt(self.response_id))
        elif self.reply is Reply.PLAYING_OUT:
            self.reply = Reply.NONE

    def _may_answer_early(self, event: SpeechPaused) -> bool:
        p = self.policy
        return (
            p.detects_turns
            and p.create_response
            and p.answers
            and self.reply in (Reply.NONE, Reply.PLAYING_OUT)
            and self.listening is Listening.SPEAKING
            and self.item_id is not None
            and event.buffered_ms >= MIN_PREEMPT_MS
        )

    def _speech_paused(self, event: SpeechPaused, out: list[Effect]) -> None:
        if self.listening is not Listening.SPEAKING:
            return
        answer = self._may_answer_early(event)
        self.listening = Listening.PAUSED
        if answer and self.item_id is not None:
            self.early = _Early(self.item_id, event.audio_ms)
            self.reply = Reply.HELD  # a reply playing out stays in `playing` until heard or cleared
            out.append(StartEarlyAnswer(self.item_id, event.audio_ms))

    def _speech_stopped(self, event: SpeechStopped, out: list[Effect]) -> None:
        if self.listening is Listening.IDLE or self.item_id is None:
            return  # the client ended this turn already (a commit mid-turn)
        item_id = self.item_id
        self.committing = _Committing(item_id, self.listening, self.announced, client=False)
        self.listening, self.item_id = Listening.IDLE, None
        out.append(EndSpeech(item_id, event.audio_ms))
        early = self.early
        if early is not None and early.item_id == item_id and early.audio_ms == event.audio_ms:
            out.append(CommitTurn(item_id, transcribe=False))
            out.append(ReleaseEarlyAnswer(item_id))
            self.released.add(item_id)  # its transcript: the one the answer heard, or decoded once it is ready
            return  # the response is the held one (ResponseStarted follows)
        self._drop(f"the turn ended at {event.audio_ms} ms, not at its pause", out)
        out.append(CommitTurn(item_id))
        if not self.policy.create_response or not self.policy.answers:
            return
        if self.reply is Reply.RESPONDING:
            return  # still answering (interrupt_response off): the next response hears this turn
        if self.reply is Reply.CANCELLING:
            self.start_after_cancel = True  # cancelled by this speech's start: its last events go first
            return
        out.append(StartResponse())

    def _commit(self, out: list[Effect]) -> None:
        self._drop("the client sent input_audio_buffer.commit", out)
        detector = self.policy.detects_turns and self.listening is not Listening.IDLE
        item_id = self.item_id or self.new_id()
        if self.listening is not Listening.IDLE:
            self.committing = _Committing(item_id, self.listening, self.announced, client=True)
        self.listening, self.item_id = Listening.IDLE, None
        out.append(CommitTurn(item_id, end_detector_turn=detector))

    def _commit_failed(self, turn: _Committing, out: list[Effect]) -> None:
        """A commit was refused (too little audio, memory): nothing was committed."""
        if turn.client and self.listening is Listening.IDLE:
            # The client's commit: the turn goes on as it was, under its item (its live
            # transcription too), so the next commit is that turn.
            self.item_id, self.listening, self.announced = turn.item_id, turn.listening, turn.announced
        else:
            # The detector's stop: its turn is over, uncommitted; its live transcription must not
            # become the next turn's (whose deltas would go out under this item's id).
            out.append(DropTurn(turn.item_id))

    # --- the assistant's side -------------------------------------------------------------

    def _drop(self, why: str, out: list[Effect]) -> None:
        early, self.early = self.early, None
        if early is None:
            return
        if self.reply is Reply.HELD:  # back to what was before the pause: a reply may still play
            self.reply = Reply.PLAYING_OUT if self.playing else Reply.NONE
        out.append(DropEarlyAnswer(early.item_id, why))

    def _cancel(self, named: str | None, out: list[Effect]) -> None:
        busy = self.reply in (Reply.RESPONDING, Reply.CANCELLING) and self.response_id is not None
        if not busy or (named and named != self.response_id):
            out.append(
                Refuse(
                    f"response {named} is not in progress" if busy else "there is no response in progress to cancel",
                    "response_cancel_not_active",
                    "response_id" if named else None,
                )
            )
            return
        assert self.response_id is not None
        self.reply = Reply.CANCELLING  # cancelled again while cancelling: its last events are awaited all the same
        out.append(CancelResponse(self.response_id))

    def _response_done(self, event: ResponseDone, out: list[Effect]) -> None:
        if self.response_id != event.response_id:
            return  # a reply already left behind (cleared while playing, replaced)
        if event.playing and self.reply is Reply.RESPONDING:
            self.playing.append(event.response_id)
        self.response_id = None
        self.reply = Reply.PLAYING_OUT if self.playing else Reply.NONE
        if self.start_after_cancel:
            self.start_after_cancel = False
            if self.policy.create_response and self.policy.answers:  # as the settings are now, not at the turn's end
                out.append(StartResponse())
