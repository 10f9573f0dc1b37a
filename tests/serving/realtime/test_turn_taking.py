"""The turn-taking core alone (:mod:`omnictl.serving.realtime.turn_taking`): scripted
timelines, each step an event and the effects it must return, in order. No session, no
loop, no clock: a row fails on a core that orders anything differently.

Every ordering bug the previous wave fixed in the session is a row here (named after what
it got wrong), so a core that brings it back fails by name."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from omnictl.serving.realtime.turn_taking import (
    AdoptTranscript,
    AudioIn,
    AwaitDrops,
    CancelResponse,
    Clear,
    ClearInput,
    ClearPlayout,
    ClientActed,
    Closed,
    Commit,
    CommitFailed,
    CommitTurn,
    Configured,
    DropEarlyAnswer,
    DropTurn,
    EarlyAnswerReady,
    EndSpeech,
    Interrupt,
    Listening,
    OpenTurn,
    OutputAudioClear,
    PlayoutFinished,
    Policy,
    Refuse,
    ReleaseEarlyAnswer,
    Reply,
    ResponseCancel,
    ResponseCreate,
    ResponseDone,
    ResponseStarted,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    StartEarlyAnswer,
    StartResponse,
    TranscribeTurn,
    TurnTaking,
)

ANY_REFUSAL = "refused"  # a step whose effect is a Refuse (its words are the shell's to test)
LIVE = Policy(live=True)
MANUAL = Policy(detects_turns=False)
NO_INTERRUPT = Policy(interrupt_response=False)
NO_CREATE = Policy(create_response=False)
TRANSCRIBES = Policy(answers=False)


@dataclass(frozen=True)
class Row:
    name: str
    steps: list[tuple[Any, list[Any]]]
    policy: Policy = Policy()
    listening: Listening | None = None  # the region's state at the end, when the row says
    reply: Reply | None = None


def speech(item: str = "i1", at: int = 0) -> list[tuple[Any, list[Any]]]:
    return [(SpeechStarted(at), [OpenTurn(item, at)])]


def paused_early(item: str = "i1", at: int = 1000) -> list[tuple[Any, list[Any]]]:
    """Speech, then a pause with an early answer started, held."""
    return [*speech(item), (SpeechPaused(at, buffered_ms=at), [StartEarlyAnswer(item, at)])]


def answered(item: str = "i1", response: str = "r1", at: int = 1000) -> list[tuple[Any, list[Any]]]:
    """A turn answered by a response started for it (no early answer: the pause came too soon)."""
    return [
        *speech(item),
        (SpeechStopped(at), [EndSpeech(item, at), CommitTurn(item), StartResponse()]),
        (ResponseStarted(response), []),
    ]


def released(item: str = "i1", response: str = "r1") -> list[tuple[Any, list[Any]]]:
    """A turn that stopped at its pause: the held answer released as the response."""
    return [
        *paused_early(item),
        (SpeechStopped(1000), [EndSpeech(item, 1000), CommitTurn(item, transcribe=False), ReleaseEarlyAnswer(item)]),
        (ResponseStarted(response), []),
    ]


ROWS = [
    # --- turns ------------------------------------------------------------------------------
    Row("a detected turn is committed and answered", answered(), listening=Listening.IDLE, reply=Reply.RESPONDING),
    Row("a transcription session commits and never answers", [
        *speech(), (SpeechStopped(900), [EndSpeech("i1", 900), CommitTurn("i1")])], policy=TRANSCRIBES),
    Row("create_response off: the turn is committed, not answered", [
        *speech(), (SpeechStopped(900), [EndSpeech("i1", 900), CommitTurn("i1")])], policy=NO_CREATE),
    Row("manual turns: the first audio opens the turn, unannounced; the commit closes it", [
        (AudioIn(), [OpenTurn("i1", 0, announce=False)]), (AudioIn(), []),
        (Commit(), [CommitTurn("i1")]), (AudioIn(), [OpenTurn("i2", 0, announce=False)])], policy=MANUAL),
    Row("a commit with no turn open commits a new item", [(Commit(), [CommitTurn("i1")])], policy=MANUAL),
    Row("with VAD, audio alone opens no turn", [(AudioIn(), [])], listening=Listening.IDLE),
    # 6e6deb0: the client's commit mid-turn is the speech_started item; the VAD's stop after it
    # commits nothing (it committed the silence after it as a second item, under the same id).
    Row("a client commit mid-turn ends that turn: the detector's later stop commits nothing", [
        *speech(), (Commit(), [CommitTurn("i1", end_detector_turn=True)]), (SpeechStopped(900), [])],
        listening=Listening.IDLE, reply=Reply.NONE),
    Row("a client commit mid-pause drops the early answer and ends the turn", [
        *paused_early(), (Commit(), [DropEarlyAnswer("i1", "the client sent input_audio_buffer.commit"),
                                     CommitTurn("i1", end_detector_turn=True)]), (SpeechStopped(1000), [])]),
    Row("a clear ends the turn: the detector's stop after it commits nothing", [
        *speech(), (Clear(), [ClearInput()]), (SpeechStopped(900), [])], listening=Listening.IDLE),
    Row("a failed commit (too little audio) drops the held answer", [
        *paused_early(), (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False),
                                                ReleaseEarlyAnswer("i1")]),
        (CommitFailed("i1"), [DropEarlyAnswer("i1", "the turn could not be committed"), DropTurn("i1")])],
        reply=Reply.NONE, listening=Listening.IDLE),
    # A refused client commit ended the turn in the core while the shell kept its live
    # transcription: the next audio opened no turn, and its deltas went out under the old id.
    Row("a refused client commit leaves the turn open under its item", [
        (AudioIn(), [OpenTurn("i1", 0, announce=False)]), (Commit(), [CommitTurn("i1")]),
        (CommitFailed("i1"), []), (AudioIn(), []), (Commit(), [CommitTurn("i1")])],
        policy=MANUAL, listening=Listening.IDLE),
    Row("a refused client commit mid-speech: the detector's stop then commits that turn", [
        *speech(), (Commit(), [CommitTurn("i1", end_detector_turn=True)]), (CommitFailed("i1"), []),
        (SpeechStopped(900), [EndSpeech("i1", 900), CommitTurn("i1"), StartResponse()])]),
    Row("a refused commit with no turn open opens none", [
        (Commit(), [CommitTurn("i1")]), (CommitFailed("i1"), []), (AudioIn(), [OpenTurn("i2", 0, announce=False)])],
        policy=MANUAL),
    Row("a detector's turn whose commit is refused ends, its live transcription dropped", [
        *speech(), (SpeechStopped(900), [EndSpeech("i1", 900), CommitTurn("i1"), StartResponse()]),
        (CommitFailed("i1"), [DropTurn("i1")]), (SpeechStarted(2000), [OpenTurn("i2", 2000)])]),
    # --- early answers --------------------------------------------------------------------
    Row("a turn that stops at its pause releases the held answer, not transcribed again", [
        *paused_early(), (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False),
                                                ReleaseEarlyAnswer("i1")]),
        (ResponseStarted("r1"), [])], reply=Reply.RESPONDING, listening=Listening.IDLE),
    Row("speech resumed after the pause drops the held answer; the turn goes on", [
        *paused_early(), (SpeechResumed(1300), [DropEarlyAnswer("i1", "the user went on speaking")]),
        (SpeechStopped(2000), [EndSpeech("i1", 2000), CommitTurn("i1"), StartResponse()])], reply=Reply.NONE),
    Row("a second pause after a resume starts a second early answer to the same item", [
        *paused_early(), (SpeechResumed(1300), [DropEarlyAnswer("i1", "the user went on speaking")]),
        (SpeechPaused(1800, 1800), [StartEarlyAnswer("i1", 1800)]),
        (SpeechStopped(1800), [EndSpeech("i1", 1800), CommitTurn("i1", transcribe=False),
                               ReleaseEarlyAnswer("i1")])]),
    Row("a turn that ends elsewhere than its pause drops the answer, and is answered anew", [
        *paused_early(), (SpeechStopped(1400), [
            EndSpeech("i1", 1400), DropEarlyAnswer("i1", "the turn ended at 1400 ms, not at its pause"),
            CommitTurn("i1"), StartResponse()])]),
    # 9a21ed1: a session.update between the pause and the turn drops the held answer; the turn
    # is answered with the new settings (a response started at the stop, not the old one released).
    Row("session.update between the pause and the turn drops the held answer", [
        *paused_early(), (Configured(Policy()), [DropEarlyAnswer("i1", "the client sent session.update")]),
        (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1"), StartResponse()])]),
    Row("an item created while held drops it", [
        *paused_early(), (ClientActed("conversation.item.create"),
                          [DropEarlyAnswer("i1", "the client sent conversation.item.create")])], reply=Reply.NONE),
    Row("response.create while held drops it and starts the client's response", [
        *paused_early(), (ResponseCreate(), [DropEarlyAnswer("i1", "the client sent response.create"),
                                             StartResponse()])]),
    Row("clear while held drops it and clears the input", [
        *paused_early(), (Clear(), [DropEarlyAnswer("i1", "the client sent input_audio_buffer.clear"), ClearInput()])],
        reply=Reply.NONE, listening=Listening.IDLE),
    # 8c04eb6: close right after a drop awaits every drop's abort (not only its own) before
    # cancelling anything: the close drops nothing more, and says to await the drops first.
    Row("close right after a clear awaits the clear's drop, dropping nothing twice", [
        *paused_early(), (Clear(), [DropEarlyAnswer("i1", "the client sent input_audio_buffer.clear"), ClearInput()]),
        (Closed(), [AwaitDrops()]), (SpeechStopped(1000), [])]),
    Row("close while held drops it, then awaits the drop", [
        *paused_early(), (Closed(), [DropEarlyAnswer("i1", "the session closed"), AwaitDrops()])]),
    Row("no early answer under 100 ms of audio", [*speech(), (SpeechPaused(300, 90), [])],
        listening=Listening.PAUSED, reply=Reply.NONE),
    # issue 46: the early answer starts from the live transcript (its tail decoded at the pause).
    Row("an early answer with a live transcriber too (it starts from the live transcript)", [
        *speech(), (SpeechPaused(1000, 1000), [StartEarlyAnswer("i1", 1000)])], policy=LIVE, reply=Reply.HELD),
    Row("no early answer in a transcription session", [*speech(), (SpeechPaused(1000, 1000), [])],
        policy=TRANSCRIBES, reply=Reply.NONE),
    Row("no early answer without create_response", [*speech(), (SpeechPaused(1000, 1000), [])],
        policy=NO_CREATE, reply=Reply.NONE),
    Row("no early answer while a response is in progress (interrupt off)", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000)]), (SpeechPaused(4000, 1000), [])],
        policy=NO_INTERRUPT, reply=Reply.RESPONDING),
    Row("no second early answer to one pause", [*paused_early(), (SpeechPaused(1000, 1000), [])], reply=Reply.HELD),
    Row("a pause with no turn open (the detector's start was the echo's) starts nothing",
        [(SpeechPaused(1000, 1000), [])], reply=Reply.NONE),
    # cd175ca: a dropped answer is never the turn's answer: the turn after the drop is answered
    # by a response started then (the dropped one's stamps are not the turn's).
    Row("a dropped answer's turn is answered by a new response, never the dropped one", [
        *paused_early(), (SpeechResumed(1200), [DropEarlyAnswer("i1", "the user went on speaking")]),
        (SpeechPaused(1500, 1500), [StartEarlyAnswer("i1", 1500)]),
        (SpeechResumed(1600), [DropEarlyAnswer("i1", "the user went on speaking")]),
        (SpeechStopped(2400), [EndSpeech("i1", 2400), CommitTurn("i1"), StartResponse()])]),
    # --- barge-in and cancels ---------------------------------------------------------------
    Row("speech over a response interrupts it", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r1")])], reply=Reply.CANCELLING),
    Row("interrupt_response off: speech over a response leaves it", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000)])], policy=NO_INTERRUPT, reply=Reply.RESPONDING),
    Row("interrupt off: a turn ending while the response goes on starts no second one", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000)]),
        (SpeechStopped(4000), [EndSpeech("i2", 4000), CommitTurn("i2")])], policy=NO_INTERRUPT),
    Row("a turn ending while its barge-in's response cancels is answered once that one is done", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r1")]),
        (SpeechStopped(4000), [EndSpeech("i2", 4000), CommitTurn("i2")]),
        (ResponseDone("r1"), [StartResponse()]), (ResponseStarted("r2"), [])], reply=Reply.RESPONDING),
    # The turn's response waited for the cancelled one's done; the client turned automatic
    # responses off meanwhile: it was started all the same.
    Row("a turn waiting on a cancel is not answered once create_response is turned off", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r1")]),
        (SpeechStopped(4000), [EndSpeech("i2", 4000), CommitTurn("i2")]),
        (Configured(NO_CREATE, turn_detection=True), []), (ResponseDone("r1"), [])], reply=Reply.NONE),
    Row("response.cancel cancels the response in progress", [
        *answered(), (ResponseCancel(), [CancelResponse("r1")]), (ResponseDone("r1"), [])], reply=Reply.NONE),
    Row("response.cancel naming another response is refused", [
        *answered(), (ResponseCancel("r9"), ANY_REFUSAL)], reply=Reply.RESPONDING),
    Row("response.cancel with none in progress is refused", [(ResponseCancel(), ANY_REFUSAL)]),
    Row("response.create while one is in progress is refused", [*answered(), (ResponseCreate(), ANY_REFUSAL)]),
    Row("response.create while one cancels is refused", [
        *answered(), (ResponseCancel(), [CancelResponse("r1")]), (ResponseCreate(), ANY_REFUSAL)]),
    Row("response.create in a transcription session is refused", [(ResponseCreate(), ANY_REFUSAL)],
        policy=TRANSCRIBES),
    Row("output_audio_buffer.clear cancels the response in progress", [
        *answered(), (OutputAudioClear(), [CancelResponse("r1")])], reply=Reply.CANCELLING),
    Row("close cancels the response in progress", [
        *answered(), (Closed(), [AwaitDrops(), CancelResponse("r1")]), (SpeechStarted(5000), [])]),
    # e65880f: a response.cancel while a released answer still transcribes cancels it (not
    # waited on until its transcription ends).
    Row("response.cancel right after an early answer's release cancels it", [
        *paused_early(), (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False),
                                                ReleaseEarlyAnswer("i1")]),
        (ResponseStarted("r1"), []), (ResponseCancel(), [CancelResponse("r1")])]),
    # What the turn's transcript is, once the released answer is ready (issue 46: the core, not
    # the release, decides): the one it heard at the pause, else decoded then, once either way.
    Row("a released answer that heard the turn: its transcript is the turn's", [
        *released(), (EarlyAnswerReady("i1", heard=True), [AdoptTranscript("i1")]),
        (EarlyAnswerReady("i1", heard=True), [])], reply=Reply.RESPONDING),
    Row("a released answer whose transcription failed: the turn is transcribed then", [
        *released(), (EarlyAnswerReady("i1", heard=False), [TranscribeTurn("i1")])]),
    # e65880f: cancelled while it still transcribes: cancelled at once, and the turn transcribed.
    Row("a released answer cancelled before it heard: the turn is transcribed", [
        *released(), (ResponseCancel(), [CancelResponse("r1")]),
        (EarlyAnswerReady("i1", heard=False), [TranscribeTurn("i1")]), (ResponseDone("r1"), [])], reply=Reply.NONE),
    Row("a released answer ready after barge-in and the next turn's own answer: still its own turn's", [
        *released(), (SpeechStarted(1500), [OpenTurn("i2", 1500), Interrupt("r1")]),
        (EarlyAnswerReady("i1", heard=True), [AdoptTranscript("i1")])]),
    Row("a ready after the session closed does nothing", [
        *released(), (Closed(), [AwaitDrops(), CancelResponse("r1")]), (EarlyAnswerReady("i1", heard=False), [])]),
    Row("a ready for a turn whose commit was refused does nothing", [
        *paused_early(), (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False),
                                                ReleaseEarlyAnswer("i1")]),
        (CommitFailed("i1"), [DropEarlyAnswer("i1", "the turn could not be committed"), DropTurn("i1")]),
        (EarlyAnswerReady("i1", heard=True), [])]),
    Row("barge-in over a released early answer interrupts it", [
        *paused_early(), (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False),
                                                ReleaseEarlyAnswer("i1")]),
        (ResponseStarted("r1"), []), (SpeechStarted(1500), [OpenTurn("i2", 1500), Interrupt("r1")])]),
    # --- a reply lives until it is heard (B1) -----------------------------------------------
    Row("B1: speech over a reply done generating but still playing clears it", [
        *answered(), (ResponseDone("r1", playing=True), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000), ClearPlayout("r1")])], reply=Reply.NONE),
    Row("a reply heard to its end is not cleared by the next speech", [
        *answered(), (ResponseDone("r1", playing=True), []), (PlayoutFinished("r1"), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000)])], reply=Reply.NONE),
    Row("a reply playing out does not block the next response", [
        *answered(), (ResponseDone("r1", playing=True), []), (ResponseCreate(), [StartResponse()])],
        reply=Reply.PLAYING_OUT),
    Row("interrupt off: speech over a reply playing out leaves it playing", [
        *answered(), (ResponseDone("r1", playing=True), []), (SpeechStarted(3000), [OpenTurn("i2", 3000)])],
        policy=NO_INTERRUPT, reply=Reply.PLAYING_OUT),
    Row("a reply cleared by output_audio_buffer.clear after its done is no longer playing", [
        *answered(), (ResponseDone("r1", playing=True), []), (OutputAudioClear(), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000)])], reply=Reply.NONE),
    Row("a late done of a reply already cleared changes nothing", [
        *answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r1")]),
        (ResponseDone("r1"), []), (ResponseDone("r1"), []), (PlayoutFinished("r1"), [])], reply=Reply.NONE),
    # A reply still playing when another starts (a response.create after its done, or an early
    # answer held at a pause) is still not heard: speech over the next one clears it too, and it
    # is cut to what was heard (it was forgotten: its item kept words the user never heard).
    Row("B1: speech over a response created while the last reply plays clears that reply too", [
        *answered(), (ResponseDone("r1", playing=True), []), (ResponseCreate(), [StartResponse()]),
        (ResponseStarted("r2"), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000), ClearPlayout("r1"), Interrupt("r2")])],
        reply=Reply.CANCELLING),
    Row("B1: two replies done while both still play: speech clears both, oldest first", [
        *answered(), (ResponseDone("r1", playing=True), []), (ResponseCreate(), [StartResponse()]),
        (ResponseStarted("r2"), []), (ResponseDone("r2", playing=True), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000), ClearPlayout("r1"), ClearPlayout("r2")])],
        reply=Reply.NONE),
    Row("a reply heard to its end while the next one streams is not cleared by speech over that one", [
        *answered(), (ResponseDone("r1", playing=True), []), (ResponseCreate(), [StartResponse()]),
        (ResponseStarted("r2"), []), (PlayoutFinished("r1"), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r2")])], reply=Reply.CANCELLING),
    Row("an early answer dropped while the last reply still plays leaves that reply playing out", [
        *speech(), (ResponseCreate(), [StartResponse()]), (ResponseStarted("r1"), []),  # asked for mid-speech
        (ResponseDone("r1", playing=True), []), (SpeechPaused(1000, 1000), [StartEarlyAnswer("i1", 1000)]),
        (SpeechResumed(1300), [DropEarlyAnswer("i1", "the user went on speaking")])],
        reply=Reply.PLAYING_OUT, listening=Listening.SPEAKING),
    Row("an early answer released while the last reply plays: speech over it clears that reply too", [
        *speech(), (ResponseCreate(), [StartResponse()]), (ResponseStarted("r1"), []),
        (ResponseDone("r1", playing=True), []), (SpeechPaused(1000, 1000), [StartEarlyAnswer("i1", 1000)]),
        (SpeechStopped(1000), [EndSpeech("i1", 1000), CommitTurn("i1", transcribe=False), ReleaseEarlyAnswer("i1")]),
        (ResponseStarted("r2"), []),
        (SpeechStarted(3000), [OpenTurn("i2", 3000), ClearPlayout("r1"), Interrupt("r2")])]),
    # --- B3: turn detection changed mid-speech ----------------------------------------------
    Row("B3: session.update of turn detection mid-speech keeps the utterance's item", [
        *speech(), (Configured(LIVE, turn_detection=True), []),
        (SpeechStarted(1200), []),  # the new detector hears the same speech start
        (SpeechStopped(2000), [EndSpeech("i1", 2000), CommitTurn("i1"), StartResponse()])], policy=LIVE),
    # The other way round: a turn opened by audio alone (turn detection off) is no speech the
    # detector heard. It went on as if spoken: the detector's start then neither said
    # speech_started nor stopped the answer in progress, and its stop committed everything
    # appended since the last commit, under an item id never announced.
    Row("turn detection turned on with a turn opened by audio alone: that turn ends uncommitted", [
        (AudioIn(), [OpenTurn("i1", 0, announce=False)]),
        (Configured(Policy(), turn_detection=True), [DropTurn("i1")])], policy=MANUAL, listening=Listening.IDLE),
    Row("turn detection turned on mid-answer: the first speech is announced and barges in", [
        (AudioIn(), [OpenTurn("i1", 0, announce=False)]), (ResponseCreate(), [StartResponse()]),
        (ResponseStarted("r1"), []), (Configured(Policy(), turn_detection=True), [DropTurn("i1")]),
        (SpeechStarted(500), [OpenTurn("i2", 500), Interrupt("r1")]),
        (SpeechStopped(1500), [EndSpeech("i2", 1500), CommitTurn("i2")]),
        (ResponseDone("r1"), [StartResponse()])], policy=MANUAL),
    Row("B3: turn detection turned off mid-speech: the client's commit is the same item", [
        *speech(), (Configured(Policy(detects_turns=False, live=True), turn_detection=True), []),
        (AudioIn(), []), (Commit(), [CommitTurn("i1")])], policy=LIVE),
]


def run_row(row: Row) -> TurnTaking:
    ids = itertools.count(1)
    core = TurnTaking(row.policy, new_id=lambda: f"i{next(ids)}")
    for step, (event, expected) in enumerate(row.steps):
        got = core.handle(event)
        if expected == ANY_REFUSAL:
            assert len(got) == 1 and isinstance(got[0], Refuse), f"step {step} ({event}): {got}"
        else:
            assert got == expected, f"step {step} ({event})"
    return core


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_timeline(row: Row) -> None:
    core = run_row(row)
    if row.listening is not None:
        assert core.listening is row.listening
    if row.reply is not None:
        assert core.reply is row.reply


# Client events at every point of a turn: whatever arrives, while an early answer is held, drops it first.
CLIENT_EVENTS = [Commit(), Clear(), ClientActed("conversation.item.delete"), ResponseCreate(),
                 ResponseCancel(), OutputAudioClear(), Configured(Policy())]


@pytest.mark.parametrize("event", CLIENT_EVENTS, ids=[type(e).__name__ for e in CLIENT_EVENTS])
def test_any_client_event_while_held_drops_the_answer_first(event: Any) -> None:
    core = run_row(Row("held", paused_early()))
    effects = core.handle(event)
    assert isinstance(effects[0], DropEarlyAnswer) and core.early is None
    # ...and the turn's stop at the pause no longer releases anything
    assert not any(isinstance(e, ReleaseEarlyAnswer) for e in core.handle(SpeechStopped(1000)))


def drive(core: TurnTaking, timeline: list[Any]) -> None:
    """Feed ``timeline`` as a shell would: each response the core starts is started at once,
    and ``"done"`` is the response in progress finishing. A response the core asks for while
    one is in progress or cancelling fails the test."""
    responses = itertools.count(1)
    for step in timeline:
        if step == "done":
            if core.response_id is None:
                continue
            step = ResponseDone(core.response_id)
        pending = core.handle(step)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, (StartResponse, ReleaseEarlyAnswer)):
                assert core.reply not in (Reply.RESPONDING, Reply.CANCELLING), f"{effect} over {core.response_id}"
                pending += core.handle(ResponseStarted(f"r{next(responses)}"))


@pytest.mark.parametrize("event", CLIENT_EVENTS, ids=[type(e).__name__ for e in CLIENT_EVENTS])
def test_no_client_event_at_any_point_leaves_two_responses(event: Any) -> None:
    """A turn answered early, then one barged in on, with a client event at every point of
    it: never two responses at once, and nothing left in progress once every one is done."""
    timeline: list[Any] = [SpeechStarted(0), SpeechPaused(1000, 1000), SpeechStopped(1000), SpeechStarted(3000),
                           SpeechPaused(3500, 500), SpeechResumed(3600), SpeechStopped(4000), "done", "done"]
    for cut in range(len(timeline) + 1):
        ids = itertools.count(1)
        core = TurnTaking(Policy(), new_id=lambda ids=ids: f"i{next(ids)}")  # this cut's ids
        drive(core, [*timeline[:cut], event, *timeline[cut:], "done", "done"])
        assert (core.listening, core.reply, core.early) == (Listening.IDLE, Reply.NONE, None), f"{event} at {cut}"


def test_completions_in_every_order_end_idle() -> None:
    """A barged-in response's done and the next turn's stop, in either order: one response
    starts, after the cancelled one is done; the session ends with nothing in progress."""
    for stop_first in (True, False):
        core = run_row(Row("barged", [*answered(), (SpeechStarted(3000), [OpenTurn("i2", 3000), Interrupt("r1")])]))
        order = [SpeechStopped(4000), ResponseDone("r1")] if stop_first else [ResponseDone("r1"), SpeechStopped(4000)]
        starts = [x for e in order for x in core.handle(e) if isinstance(x, StartResponse)]
        assert starts == [StartResponse()]
        core.handle(ResponseStarted("r2"))
        core.handle(ResponseDone("r2"))
        assert (core.listening, core.reply, core.response_id, core.early) == (Listening.IDLE, Reply.NONE, None, None)


def test_the_docs_state_diagram_names_the_cores_states() -> None:
    """docs/serving.md draws the core: every state of each region is drawn, and nothing else."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[3] / "docs" / "serving.md").read_text()
    diagram = page[page.index('state "a session: the user\'s side | the reply"') :]
    diagram = diagram[: diagram.index("```")]
    user, reply = diagram.split("\n    --\n")
    drawn = lambda part: {s for a, b in re.findall(r"(\S+) --> (\w+)", part) for s in (a, b)} - {"[*]"}
    assert drawn(user) == {state.value for state in Listening}
    assert drawn(reply) == {state.value for state in Reply}
