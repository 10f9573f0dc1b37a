"""The TTS stage speaks sentence by sentence while the text streams in."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnictl.models.voice_assistant.speech_scheduler import SentenceSpeechScheduler
from omnictl.models.voice_assistant.tts import PiperSpeaker
from omnictl.outputs import AudioChunk, AudioResult, TokenDelta, TokenResult
from omnictl.schedulers.base import IncomingKind, OutgoingKind

from .conftest import drained, incoming, next_out, run, until_result

ANSWER = "The capital of France is Paris. It is known for the Eiffel Tower. Many people visit it every year."


@pytest.fixture
def speaker(piper: PiperSpeaker) -> PiperSpeaker:
    return piper  # the package's one Piper (conftest.py)


def scheduler_with(speaker: PiperSpeaker) -> SentenceSpeechScheduler:
    return SentenceSpeechScheduler(speaker_factory=lambda voice: speaker)


def test_first_audio_comes_before_the_text_is_complete(speaker: PiperSpeaker) -> None:
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            words = ANSWER.split(" ")
            first_clause_words = 4  # "The capital of France", handed out once "is" is whole
            for word in words[: first_clause_words + 1]:
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r1", TokenDelta(text=word + " ", token_ids=[1])))
            first = await next_out(scheduler)
            # Only a clause of the first sentence (and one word) has been streamed: the audio
            # waits neither for the rest of the answer nor for the end of its first sentence.
            assert first.kind is OutgoingKind.STREAM
            assert isinstance(first.data, AudioChunk) and not isinstance(first.data, AudioResult)
            assert first.data.transcript == "The capital of France"
            assert first.data.sample_rate == speaker.sample_rate
            assert first.data.samples.dtype == np.float32 and first.data.samples.size > speaker.sample_rate // 2

            for word in words[first_clause_words + 1 :]:
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r1", TokenDelta(text=word + " ", token_ids=[1])))
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_DONE, "r1"))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r1", TokenResult(text=ANSWER + " ", completion_tokens=20)))
            streamed, result = await until_result(scheduler, "r1")
            assert result.kind is OutgoingKind.RESULT
            assert isinstance(result.data, AudioResult) and result.data.sample_rate == speaker.sample_rate
            assert all(isinstance(m.data, AudioChunk) and not isinstance(m.data, AudioResult) for m in streamed)
            transcripts = [first.data.transcript] + [m.data.transcript for m in streamed]
            assert transcripts == ["The capital of France", "is Paris.", "It is known for the Eiffel Tower.",
                                   "Many people visit it every year."]
            # the pieces' transcripts, in order, are the answer: the audio says the same words
            assert " ".join(transcripts) == ANSWER
            assert result.data.transcript == ANSWER
            whole = np.concatenate([first.data.samples] + [m.data.samples for m in streamed])
            np.testing.assert_array_equal(result.data.samples, whole)
            assert scheduler.load().running == 0 and scheduler.load().stream_buffers == 0
        finally:
            await scheduler.stop()

    run(main())


def test_a_result_that_overtakes_the_stream_still_speaks_everything(speaker: PiperSpeaker) -> None:
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r2", TokenDelta(text="Paris is ")))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r2", TokenResult(text="Paris is lovely. Yes.")))
            # Late stream messages of a finished request must not start it again.
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r2", TokenDelta(text="lovely. ")))
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_DONE, "r2"))
            streamed, result = await until_result(scheduler, "r2")
            assert [m.data.transcript for m in streamed] == ["Paris is lovely.", "Yes."]
            assert result.data.transcript == "Paris is lovely. Yes."
            await drained(scheduler)
            assert scheduler.outbox.empty()
            assert scheduler.load().running == 0 and scheduler.load().stream_buffers == 0
        finally:
            await scheduler.stop()

    run(main())


def test_abort_drops_the_request_and_its_queued_sentences(speaker: PiperSpeaker) -> None:
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "gone", TokenDelta(text="One. Two. Three. Four. ")))
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "kept", TokenDelta(text="Hello there. ")))
            first = await next_out(scheduler)
            assert first.request_id == "gone"
            scheduler.abort("gone")
            assert scheduler.load().running == 1  # only "kept" is left
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "gone", TokenResult(text="One. Two. Three. Four.")))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "kept", TokenResult(text="Hello there.")))
            streamed, result = await until_result(scheduler, "kept")
            assert result.kind is OutgoingKind.RESULT and result.data.transcript == "Hello there."
            await drained(scheduler)
            leftovers = [scheduler.outbox.get_nowait() for _ in range(scheduler.outbox.qsize())]
            assert all(m.request_id != "gone" for m in leftovers)
            assert scheduler.load().running == 0 and scheduler.load().queued == 0
        finally:
            await scheduler.stop()

    run(main())


def test_unknown_voice_fails_the_request_naming_the_voice(speaker: PiperSpeaker) -> None:
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r3", TokenDelta(text="Hi. "), voice="alloy"))
            error = await next_out(scheduler)
            assert error.kind is OutgoingKind.ERROR and "'alloy'" in (error.error or "") and "joe" in (error.error or "")
            assert scheduler.load().running == 0
        finally:
            await scheduler.stop()

    run(main())


def test_piper_refuses_speech_sampling_naming_the_field_and_speaks_without_it(speaker: PiperSpeaker) -> None:
    """A speech request's sampling (vLLM's speech fields) reaches this stage; Piper samples
    nothing, so it refuses by name rather than speak as if it had honoured it."""
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            asked = {"speech_sampling": {"temperature": 0.5, "max_tokens": 9}}
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r4", TokenResult(text="Hi. "), **asked))
            error = await next_out(scheduler)
            assert error.kind is OutgoingKind.ERROR and error.field == "sampling.max_tokens"
            assert "Piper" in (error.error or "") and "cannot honour" in (error.error or "")
            assert scheduler.load().running == 0
        finally:
            await scheduler.stop()

    run(main())


def test_chunks_without_text_fail_the_request(speaker: PiperSpeaker) -> None:
    async def main() -> None:
        scheduler = scheduler_with(speaker)
        scheduler.stage_name = "tts"
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r4", {"token_ids": [3]}))
            error = await next_out(scheduler)
            assert error.kind is OutgoingKind.ERROR and error.request_id == "r4"
            assert "stage tts" in (error.error or "") and "expected TextDelta" in (error.error or "")
            assert "['token_ids']" in (error.error or "")  # names what it got
            assert scheduler.load().running == 0 and scheduler.load().stream_buffers == 0
        finally:
            await scheduler.stop()

    run(main())

def test_one_request_of_many_short_sentences_holds_one_place_not_a_thousand(speaker: PiperSpeaker) -> None:
    """Issue 24, bug 4: "Hi. " x 1024 put ~1,000 sentences in the queue; backpressure counted
    them as 1,000 queued requests (the stage's inbox of 32 was "full") and admission refused
    every new request, text-only ones included. It counts requests waiting now."""
    from omnictl.topology.model import RelayKnobs

    async def main() -> None:
        scheduler = scheduler_with(speaker)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r1", TokenDelta(text="Hi. " * 1024, token_ids=[1])))
            for _ in range(200):
                if scheduler.load().queued > 100:
                    break
                await asyncio.sleep(0.01)
            load = scheduler.load()
            assert load.queued > RelayKnobs().inbox  # ~1,000 sentences waiting to be spoken...
            assert load.waiting() == 1 < RelayKnobs().inbox  # ...for one request: the stage is not full
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r2", TokenDelta(text="Hello there. ", token_ids=[1])))
            for _ in range(200):
                if scheduler.load().waiting() == 2:
                    break
                await asyncio.sleep(0.01)
            assert scheduler.load().waiting() == 2
            scheduler.abort("r1")
            scheduler.abort("r2")
        finally:
            await scheduler.stop()

    run(main())


class SlowSpeaker:
    """A test double for Piper: 0.15 s to 'synthesise' 5 s of silence per sentence."""

    sample_rate = 16_000

    def synthesize(self, text: str, speed: float = 1.0) -> np.ndarray:
        import time

        time.sleep(0.15)
        return np.zeros(5 * self.sample_rate, dtype=np.float32)


@pytest.mark.parametrize(("policy", "order"), [
    ("fifo", ["a:One.", "b:Hello there.", "a:Two.", "a:Three.", "a:Four."]),
    ("deadline", ["a:One.", "b:Hello there.", "a:Two.", "a:Three.", "a:Four."]),
])
def test_the_stream_with_less_slack_is_spoken_first(policy: str, order: list[str]) -> None:
    """a has 5 s of audio playing when b arrives: under `deadline` b's first sentence (due
    0.5 s after it arrived) goes before a's queued ones; under `fifo` too, as a first piece
    goes ahead of other requests' later sentences (issue 46: it waited behind all of them)."""
    async def main() -> list[str]:
        slow = SlowSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: slow,  # type: ignore[arg-type,return-value]
                                            audio_policy=policy, ttfp_target_s=0.5)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "a", TokenDelta(text="One. Two. Three. Four. ", token_ids=[1])))
            await asyncio.sleep(0.05)  # a's first sentence is being spoken
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "b", TokenDelta(text="Hello there. ", token_ids=[1])))
            spoken = []
            for _ in order:
                message = await next_out(scheduler)
                assert message.kind is OutgoingKind.STREAM
                spoken.append(f"{message.request_id}:{message.data.transcript}")
            return spoken
        finally:
            await scheduler.stop()

    assert run(main()) == order


class ProportionalSpeaker:
    """A test double for Piper whose cost grows with the text: 10 ms of synthesis and 30 ms
    of audio a character (three times faster than real time, like Piper on a busy core)."""

    sample_rate = 16_000

    def __init__(self) -> None:
        self.spoken: list[str] = []

    def synthesize(self, text: str, speed: float = 1.0) -> np.ndarray:
        import time

        time.sleep(0.010 * len(text))
        self.spoken.append(text)
        return np.zeros(int(0.030 * len(text) * self.sample_rate), dtype=np.float32)


@pytest.mark.parametrize("policy", ["fifo", "deadline"])
def test_a_long_sentence_after_a_short_first_piece_is_cut_to_fit_the_audio_in_hand(policy: str) -> None:
    """The first piece (24 characters) plays 0.72 s; the 150-character sentence after it takes
    1.5 s to synthesise whole, so under `fifo` the listener waits ~0.8 s. Under `deadline`
    the TTS cuts it into pieces whose synthesis fits in half the audio left (a ramp: each
    piece's audio pays for a longer next one), and the listener never waits."""
    import time

    from omnictl.playback.continuity import PlaybackClock

    first = "Bees are small and busy."
    second = ("Bees visit thousands of flowers every single day, carrying pollen from one plant "
              "to the next, and without them many of the fruits we eat would not grow at all.")

    async def main() -> tuple[list[str], float, str]:
        speaker = ProportionalSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker,  # type: ignore[arg-type,return-value]
                                            audio_policy=policy)
        await scheduler.start()
        try:
            clock = PlaybackClock(time.monotonic())
            text = f"{first} {second}"
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=text + " ", token_ids=[1])))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", TokenResult(text=text)))
            while (message := await next_out(scheduler)).kind is OutgoingKind.STREAM:
                clock.chunk(time.monotonic(), message.data.samples.size / speaker.sample_rate)  # as it leaves the stage
            assert message.kind is OutgoingKind.RESULT, message
            return speaker.spoken, clock.report().largest_underrun_s, message.data.transcript
        finally:
            await scheduler.stop()

    spoken, largest, transcript = run(main())
    assert transcript == f"{first} {second}"  # every word spoken once, in order
    assert spoken[0] == first
    if policy == "fifo":
        assert spoken == [first, second]
        assert largest > 0.5
    else:
        # 0.72 s of audio in hand: half of it pays for 36 characters at 10 ms each, cut at the
        # last space; the next pieces grow with the audio they find in hand
        assert spoken[1] == "Bees visit thousands of flowers"
        assert len(spoken) >= 3 and len(spoken[2]) > len(spoken[1])
        assert " ".join(spoken[1:]) == second
        assert largest < 0.1


@pytest.mark.parametrize("policy", ["fifo", "deadline"])
def test_a_listener_about_to_run_dry_gets_the_words_written_so_far(policy: str) -> None:
    """The first sentence plays 0.42 s; the next one is written a word every 50 ms (an LLM on
    a loaded machine). Under either policy its whole words so far go to the TTS as soon as
    the listener would otherwise run out, rather than waiting for the sentence's end."""
    second = "Each of them visits thousands of flowers every single day of the summer."

    async def main() -> list[str]:
        speaker = ProportionalSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker,  # type: ignore[arg-type,return-value]
                                            audio_policy=policy)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text="Bees are busy. ", token_ids=[1])))
            assert (await next_out(scheduler)).data.transcript == "Bees are busy."
            for word in second.split(" "):
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=word + " ", token_ids=[1])))
                await asyncio.sleep(0.05)
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", TokenResult(text="Bees are busy. " + second)))
            streamed, result = await until_result(scheduler, "r")
            assert result.data.transcript == "Bees are busy. " + second
            return [m.data.transcript for m in streamed]
        finally:
            await scheduler.stop()

    spoken = run(main())
    assert len(spoken) >= 2 and " ".join(spoken) == second
    # the listener has under half a second left: whole words from 12 characters go, not 30
    assert second.startswith(spoken[0]) and 12 <= len(spoken[0]) < 30


class PiperPaceSpeaker:
    """A test double for Piper at its measured pace on a busy core: 8 ms of synthesis and
    65 ms of speech a character (8x faster than real time), 30 ms per call on top."""

    sample_rate = 16_000

    def __init__(self) -> None:
        self.spoken: list[str] = []

    def synthesize(self, text: str, speed: float = 1.0) -> np.ndarray:
        import time

        time.sleep(0.030 + 0.008 * len(text))
        self.spoken.append(text)
        return np.zeros(int(0.065 * len(text) * self.sample_rate), dtype=np.float32)


@pytest.mark.parametrize("policy", ["fifo", "deadline"])
def test_a_short_first_clause_then_the_rest_without_gaps(policy: str) -> None:
    """A one-sentence answer written a word every 80 ms (SmolLM2 on the busy 2-core machine):
    its first piece is a clause of four words, spoken after five words are written, and
    the rest follows clause by clause, each piece synthesised before the one before has
    played (the listener never waits more than 50 ms)."""
    import time

    from omnictl.playback.continuity import PlaybackClock

    answer = ("The capital of France is Paris, a large city on the river Seine that is famous "
              "for its museums, its food, its long history and of course the Eiffel Tower.")

    async def main() -> tuple[list[str], list[str], float, float]:
        speaker = PiperPaceSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker,  # type: ignore[arg-type,return-value]
                                            audio_policy=policy)
        await scheduler.start()
        try:
            started = time.monotonic()
            clock = PlaybackClock(started)
            spoken: list[str] = []

            async def listen() -> None:
                while (message := await next_out(scheduler)).kind is OutgoingKind.STREAM:
                    clock.chunk(time.monotonic(), message.data.samples.size / speaker.sample_rate)
                    spoken.append(message.data.transcript)
                assert message.kind is OutgoingKind.RESULT, message
                assert message.data.transcript == answer

            listener = asyncio.create_task(listen())
            for word in answer.split(" "):
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=word + " ", token_ids=[1])))
                await asyncio.sleep(0.08)
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", TokenResult(text=answer)))
            await listener
            report = clock.report()
            assert report.ttfp_s is not None
            return spoken, speaker.spoken, report.ttfp_s, report.largest_underrun_s
        finally:
            await scheduler.stop()

    spoken, synthesised, ttfp, largest = run(main())
    assert spoken[0] == "The capital of France"
    assert " ".join(spoken) == answer  # the same words, each once, in order
    assert synthesised == spoken
    # five words written (0.4 s) and four synthesised; a whole first sentence would be 2.2 s
    assert ttfp < 1.0
    assert largest < 0.05, (spoken, largest)


def test_without_first_words_the_first_piece_is_the_first_sentence() -> None:
    """``first_words=None`` (``tts.first_words: null``): the first piece waits for its
    sentence's end, as before the short first clause (what the benchmarks compare with)."""
    async def main() -> list[str]:
        speaker = ProportionalSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker,  # type: ignore[arg-type,return-value]
                                            first_words=None)
        await scheduler.start()
        try:
            text = "The capital of France is Paris, a city on the Seine."
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=text + " ", token_ids=[1])))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", TokenResult(text=text)))
            streamed, _ = await until_result(scheduler, "r")
            return [m.data.transcript for m in streamed]
        finally:
            await scheduler.stop()

    assert run(main()) == ["The capital of France is Paris, a city on the Seine."]


def test_at_the_last_moment_a_few_words_go_rather_than_silence() -> None:
    """A first clause of two words ("I'm sorry,": 0.65 s of audio) and a thinker writing a
    word every 150 ms: waiting for 30 characters of the rest would leave the listener in
    silence; with half a second left, the two or three words written so far are spoken."""
    import time

    from omnictl.playback.continuity import PlaybackClock

    answer = "I'm sorry, but I don't know the answer to that question."

    async def main() -> tuple[list[str], float]:
        speaker = PiperPaceSpeaker()
        scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker)  # type: ignore[arg-type,return-value]
        await scheduler.start()
        try:
            clock = PlaybackClock(time.monotonic())
            spoken: list[str] = []

            async def listen() -> None:
                while (message := await next_out(scheduler)).kind is OutgoingKind.STREAM:
                    clock.chunk(time.monotonic(), message.data.samples.size / speaker.sample_rate)
                    spoken.append(message.data.transcript)

            listener = asyncio.create_task(listen())
            for word in answer.split(" "):
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=word + " ", token_ids=[1])))
                await asyncio.sleep(0.15)
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", TokenResult(text=answer)))
            await listener
            return spoken, clock.report().largest_underrun_s
        finally:
            await scheduler.stop()

    spoken, largest = run(main())
    assert spoken[0] == "I'm sorry," and " ".join(spoken) == answer
    assert 12 <= len(spoken[1]) < 30, spoken
    assert largest < 0.1, (spoken, largest)
