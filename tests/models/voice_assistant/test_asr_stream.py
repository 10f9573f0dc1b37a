"""The asr_stream stage: its scheduler driven alone as a Stage drives it, and a real pipeline
with a streamed input (real processes, real Whisper base)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import omnictl
from benchmarks.eval.quality import word_errors
from benchmarks.eval.samples import sample_question, sample_text
from omnictl.audio import float_to_pcm16_bytes, resample
from omnictl.models.voice_assistant.asr import whisper_base_dir
from omnictl.models.voice_assistant.asr_stream import StreamingAsrScheduler
from omnictl.models.voice_assistant.incremental_asr import IncrementalSettings, WhisperDecoder
from omnictl.outputs import AudioChunk, Transcript
from omnictl.pipeline import Pipeline
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage
from tests.models.voice_assistant.conftest import run, until_result

TOPOLOGY = Path(__file__).resolve().parent / "asr_stream.yaml"
RATE = 24_000  # the Realtime protocol's PCM16 rate
CHUNK = RATE // 10  # 100 ms


@pytest.fixture
def decoder(whisper_decoder: WhisperDecoder) -> WhisperDecoder:
    return whisper_decoder  # the package's one Whisper (conftest.py)


def speech(name: str) -> np.ndarray:
    samples, rate = sample_question(name)
    return resample(samples, rate, RATE)


def chunk(rid: str, data: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_CHUNK, rid, data=data, source="coordinator")


def done(rid: str) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_DONE, rid, source="coordinator")


async def started(decoder: WhisperDecoder) -> StreamingAsrScheduler:
    scheduler = StreamingAsrScheduler(decoder, IncrementalSettings(cadence_s=0.4))
    await scheduler.start()
    return scheduler


async def idle(scheduler: StreamingAsrScheduler) -> None:
    """Every message taken and every job the worker had finished."""
    while not scheduler.inbox.empty():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert scheduler._executor is not None
    await asyncio.wrap_future(scheduler._executor.submit(lambda: None))


def test_deltas_arrive_before_the_input_ends_and_add_up_to_the_transcript(decoder: WhisperDecoder) -> None:
    audio = speech("largest_planet")

    async def main() -> tuple[list[str], list[OutgoingMessage], OutgoingMessage]:
        scheduler = await started(decoder)
        try:
            before_end: list[str] = []
            for offset in range(0, audio.size, CHUNK):
                scheduler.inbox.put_nowait(chunk("r", AudioChunk(samples=audio[offset : offset + CHUNK], sample_rate=RATE)))
                await idle(scheduler)  # as fast as the decoder goes: each chunk's pass done before the next
                while not scheduler.outbox.empty():
                    before_end.append(scheduler.outbox.get_nowait().data.text)
            scheduler.inbox.put_nowait(done("r"))
            streamed, result = await until_result(scheduler, "r")
            await idle(scheduler)
            assert scheduler.load().running == 0
            return before_end, streamed, result
        finally:
            await scheduler.stop()

    before_end, after_end, result = run(main())
    assert result.kind is OutgoingKind.RESULT and isinstance(result.data, Transcript), result
    assert len(before_end) >= 2, before_end
    assert all(isinstance(message.data, Transcript) for message in after_end)
    assert "".join(before_end) + "".join(m.data.text for m in after_end) == result.data.text
    assert word_errors(sample_text("largest_planet"), result.data.text)[0] == 0, result.data.text
    assert result.data.duration == pytest.approx(audio.size / RATE, abs=0.01)


def test_pcm16_at_24_khz_with_a_context_gives_the_spoken_question(decoder: WhisperDecoder) -> None:
    pcm = float_to_pcm16_bytes(speech("spider_legs"))

    async def main() -> OutgoingMessage:
        scheduler = await started(decoder)
        try:
            scheduler.inbox.put_nowait(chunk("r", {"context": "We were talking about insects and spiders."}))
            step = CHUNK * 2
            for offset in range(0, len(pcm), step):
                scheduler.inbox.put_nowait(chunk("r", pcm[offset : offset + step]))
            scheduler.inbox.put_nowait(done("r"))
            return (await until_result(scheduler, "r"))[1]
        finally:
            await scheduler.stop()

    result = run(main())
    assert isinstance(result.data, Transcript), result
    assert word_errors(sample_text("spider_legs"), result.data.text)[0] == 0, result.data.text


def test_an_abort_mid_stream_leaves_nothing(decoder: WhisperDecoder) -> None:
    audio = speech("largest_planet")
    pieces = [audio[offset : offset + CHUNK] for offset in range(0, audio.size, CHUNK)]

    async def main() -> list[OutgoingMessage]:
        scheduler = await started(decoder)
        try:
            sent = 0
            while scheduler.outbox.empty():  # until a word is confirmed: decoding is under way
                assert sent < len(pieces) // 2, "no word confirmed in the first half of the question"
                scheduler.inbox.put_nowait(chunk("r", AudioChunk(samples=pieces[sent], sample_rate=RATE)))
                sent += 1
                await idle(scheduler)
            for piece in pieces[sent:]:  # the rest at once: a pass starts on them
                scheduler.inbox.put_nowait(chunk("r", AudioChunk(samples=piece, sample_rate=RATE)))
            while not scheduler.inbox.empty():
                await asyncio.sleep(0.01)
            scheduler.abort("r")
            scheduler.inbox.put_nowait(chunk("r", AudioChunk(samples=pieces[0], sample_rate=RATE)))
            scheduler.inbox.put_nowait(done("r"))
            await idle(scheduler)
            await asyncio.sleep(0.2)
            assert scheduler.load().running == 0 and scheduler.load().stream_buffers == 0
            assert not scheduler._utterances
            late = []
            while not scheduler.outbox.empty():
                late.append(scheduler.outbox.get_nowait())
            return late
        finally:
            await scheduler.stop()

    late = run(main())
    # a delta the pass already running confirmed may still come out; never the result
    assert all(message.kind is OutgoingKind.STREAM for message in late), late


@pytest.mark.parametrize(
    ("first", "second", "named"),
    [
        (b"\x00\x01\x02", None, "odd number of bytes"),
        ("audio", None, "must be an AudioChunk, PCM16 bytes"),
        (AudioChunk(samples=np.zeros(1600, np.float32), sample_rate=16_000), {"context": "late"}, "before any audio"),
        (
            AudioChunk(samples=np.zeros(1600, np.float32), sample_rate=16_000),
            AudioChunk(samples=np.zeros(2400, np.float32), sample_rate=24_000),
            "sample_rate changed from 16000 to 24000",
        ),
    ],
)
def test_a_bad_chunk_fails_the_request_naming_the_input(first: Any, second: Any, named: str) -> None:
    # Whisper's double: a bad chunk is refused as it is taken, before anything is decoded
    # (no Whisper load in the fast subset)
    async def main() -> OutgoingMessage:
        scheduler = await started(HeardDecoder())  # type: ignore[arg-type]  # a double for WhisperDecoder
        try:
            scheduler.inbox.put_nowait(chunk("r", first))
            if second is not None:
                scheduler.inbox.put_nowait(chunk("r", second))
            scheduler.inbox.put_nowait(done("r"))
            message = (await until_result(scheduler, "r"))[1]
            await idle(scheduler)
            assert not scheduler._utterances
            return message
        finally:
            await scheduler.stop()

    message = run(main())
    assert message.kind is OutgoingKind.ERROR and named in str(message.error), message
    assert message.field == "input"


def test_a_whole_input_is_refused() -> None:
    async def main() -> OutgoingMessage:
        scheduler = await started(HeardDecoder())  # type: ignore[arg-type]  # refused before any decode
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", data={"audio": b""}))
            return (await until_result(scheduler, "r"))[1]
        finally:
            await scheduler.stop()

    message = run(main())
    assert message.kind is OutgoingKind.ERROR and "input_stream=True" in str(message.error)


@pytest.mark.slow  # real processes and Whisper base loaded in the stage's process
@pytest.mark.timeout(300)
def test_a_streamed_question_through_a_real_pipeline(tmp_path: Path) -> None:
    whisper_base_dir()  # the cache built here, where a failure is readable
    audio = speech("capital_of_france")

    async def main() -> tuple[list[str], int, Any]:
        async with Pipeline.launch(TOPOLOGY, device="cpu", run_dir=tmp_path, profile=False) as pipe:
            request = await pipe.submit(None, input_stream=True)
            ended = asyncio.Event()

            async def feed() -> None:
                for offset in range(0, audio.size, CHUNK):
                    await request.send(AudioChunk(samples=audio[offset : offset + CHUNK], sample_rate=RATE))
                    await asyncio.sleep(0.1)  # real time: a chunk every 100 ms
                await request.end_input()
                ended.set()

            feeder = asyncio.create_task(feed())
            deltas: list[str] = []
            during = 0
            async for event in request.events():
                if event.kind is omnictl.RequestEventKind.STREAM:
                    deltas.append(event.data.text)
                    during += not ended.is_set()
            await feeder
            return deltas, during, (await request.result())["asr_stream"]

    deltas, during, result = asyncio.run(main())
    assert isinstance(result, Transcript), result
    assert during >= 1, deltas  # words came while the input was still streaming
    assert "".join(deltas) == result.text
    assert word_errors(sample_text("capital_of_france"), result.text)[0] == 0, result.text


class HeardDecoder:
    """A test double for Whisper alone: hears nothing, keeps the audio of each decode."""

    def __init__(self) -> None:
        self.heard: list[np.ndarray] = []

    def encode_text(self, text: str) -> list[int]:
        return []

    def text(self, tokens: list[int]) -> str:
        return ""

    def starts_word(self, token: int) -> bool:
        return True

    def decode(self, audio: np.ndarray, **_: Any) -> list[int]:
        self.heard.append(audio.copy())
        return []


def test_the_stream_is_resampled_once_as_it_comes_the_same_as_the_whole() -> None:
    """Each pass resampled the whole input again (quadratic in the turn) and kept only what was
    new: its first samples had been made with silence after the previous pass's end. One
    stream: what the passes and the final decode hear is the whole input resampled."""
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(3 * RATE) / RATE)).astype(np.float32)
    pcm = float_to_pcm16_bytes(tone)
    decoder = HeardDecoder()

    async def main() -> OutgoingMessage:
        scheduler = StreamingAsrScheduler(decoder, IncrementalSettings(cadence_s=0.1))  # type: ignore[arg-type]
        await scheduler.start()
        try:
            for offset in range(0, len(pcm), 2 * 1_001):  # 1,001 samples a chunk, each taken alone
                scheduler.inbox.put_nowait(chunk("r", pcm[offset : offset + 2 * 1_001]))
                while not scheduler.inbox.empty():  # taken, and its job (if any) queued
                    await asyncio.sleep(0)
                assert scheduler._executor is not None  # then done: a job after it has run
                await asyncio.wrap_future(scheduler._executor.submit(lambda: None))
            scheduler.inbox.put_nowait(done("r"))
            return (await until_result(scheduler, "r"))[1]
        finally:
            await scheduler.stop()

    result = run(main())
    assert isinstance(result.data, Transcript) and result.data.duration == pytest.approx(3.0)
    whole = resample(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768, RATE, 16_000)
    assert len(decoder.heard) > 20 and decoder.heard[-1].size == whole.size
    for heard in decoder.heard:  # every pass heard the stream so far, exactly
        assert np.abs(heard - whole[: heard.size]).max() < 1e-4


class WordsDecoder:
    """A test double for Whisper alone: hears one word per 100 ms of voiced audio ("w0 w1 ..."),
    always extending the forced prefix; counts the samples each decode heard."""

    def __init__(self) -> None:
        self.heard: list[int] = []

    def encode_text(self, text: str) -> list[int]:
        return []

    def text(self, tokens: list[int]) -> str:
        return " ".join(f"w{t}" for t in tokens)

    def starts_word(self, token: int) -> bool:
        return True

    def decode(self, audio: np.ndarray, *, prefix: list[int], **_: Any) -> list[int]:
        self.heard.append(audio.size)
        return list(range(max(len(prefix), int(np.count_nonzero(np.abs(audio) > 0.01)) // 1_600)))


def test_one_scheduler_takes_whole_requests_and_streamed_ones_and_a_tentative_transcript() -> None:
    """The voice assistant's asr (issue 46): whole requests are decoded by its whole decode,
    streamed ones incrementally, on one scheduler (one Whisper); a {"tentative": True} chunk
    gets the transcript so far as a chunk of task 'tentative'; a streamed request's result
    waits for the entry's {"listened": True} and has the whole decode's shape."""
    from omnictl.outputs import TENTATIVE

    decoder = WordsDecoder()
    wholes: list[Any] = []

    def whole(data: dict[str, Any]) -> Any:
        wholes.append(data)
        yield Transcript(text="a segment")
        return {"messages": [{"role": "user", "content": "whole"}], "transcript": Transcript(text="whole")}

    voiced = np.concatenate([np.full(RATE, 0.2, np.float32), np.zeros(RATE // 5, np.float32)])
    pcm = float_to_pcm16_bytes(voiced)  # 1 s of "speech" at 24 kHz, then 200 ms of silence

    async def main() -> tuple[Any, ...]:
        scheduler = StreamingAsrScheduler(decoder, IncrementalSettings(cadence_s=0.4), whole=whole, result_on="request")  # type: ignore[arg-type]  # the test double
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "w", data={"audio": {}}, source="preprocessing"))
            whole_out = await until_result(scheduler, "w")
            for offset in range(0, len(pcm), 2 * CHUNK):
                scheduler.inbox.put_nowait(chunk("s", pcm[offset : offset + 2 * CHUNK]))
            scheduler.inbox.put_nowait(chunk("s", {"tentative": True}))
            streamed: list[OutgoingMessage] = []
            while not any(m.data.task == TENTATIVE for m in streamed):
                message = await asyncio.wait_for(scheduler.outbox.get(), 30)
                assert message.kind is OutgoingKind.STREAM, message
                streamed.append(message)
            heard_at_tentative = list(decoder.heard)
            scheduler.inbox.put_nowait(done("s"))
            await idle(scheduler)
            while not scheduler.outbox.empty():  # the rest of the transcript, as the last delta
                streamed.append(scheduler.outbox.get_nowait())
                assert streamed[-1].kind is OutgoingKind.STREAM  # no result before the entry's
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "s", data={"listened": True}, source="preprocessing"))
            rest, result = await until_result(scheduler, "s")
            return whole_out, streamed + rest, result, heard_at_tentative
        finally:
            await scheduler.stop()

    (whole_streamed, whole_result), streamed, result, heard_at_tentative = run(main())
    assert [m.data.text for m in whole_streamed] == ["a segment"] and whole_result.data["transcript"].text == "whole"
    assert wholes == [{"audio": {}}]
    [tentative] = [m.data for m in streamed if m.data.task == TENTATIVE]
    deltas = "".join(m.data.text for m in streamed if m.data.task != TENTATIVE)
    assert tentative.text == " ".join(f"w{i}" for i in range(10))  # 1 s of speech: ten words so far
    assert result.kind is OutgoingKind.RESULT
    heard = result.data["transcript"]
    assert heard.text == tentative.text == deltas and result.data["messages"] == [{"role": "user", "content": heard.text}]
    assert len(decoder.heard) == len(heard_at_tentative)  # only silence (none) since: the end decoded nothing


def test_a_streamed_request_that_sent_nothing_has_an_empty_transcript() -> None:
    async def main() -> OutgoingMessage:
        scheduler = StreamingAsrScheduler(WordsDecoder(), IncrementalSettings(), result_on="request")  # type: ignore[arg-type]  # the test double
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "e", data={"listened": True}, source="preprocessing"))
            return (await until_result(scheduler, "e"))[1]
        finally:
            await scheduler.stop()

    result = run(main())
    assert result.kind is OutgoingKind.RESULT and result.data["transcript"].text == ""
    assert result.data["messages"] == [{"role": "user", "content": ""}]


# --- the voice assistant's asr: one Whisper for whole and streamed questions (issue 46) --------

LISTENING = Path(__file__).resolve().parent / "listening.yaml"


@pytest.mark.slow  # Whisper base loaded here, two questions decoded
def test_the_voice_assistants_asr_loads_one_whisper_for_whole_and_streamed_questions(monkeypatch: pytest.MonkeyPatch) -> None:
    import faster_whisper

    from benchmarks.eval.samples import sample_request
    from omnictl.models.voice_assistant import stages

    made: list[Any] = []

    class Counted(faster_whisper.WhisperModel):  # type: ignore[misc]  # faster-whisper is untyped
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(faster_whisper, "WhisperModel", Counted)
    scheduler = stages.asr(beam_size=5, window_padding_s=8.0, listening={"cadence_s": 0.4})
    assert isinstance(scheduler, StreamingAsrScheduler) and len(made) == 1 and scheduler.decoder.model is made[0]
    pcm = float_to_pcm16_bytes(speech("spider_legs"))

    async def main() -> tuple[OutgoingMessage, OutgoingMessage]:
        await scheduler.start()
        try:
            data = stages.prepare_question(sample_request("largest_planet"))
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "whole", data=data, source="preprocessing"))
            whole = (await until_result(scheduler, "whole"))[1]
            for offset in range(0, len(pcm), 2 * CHUNK):
                scheduler.inbox.put_nowait(chunk("streamed", pcm[offset : offset + 2 * CHUNK]))
            scheduler.inbox.put_nowait(done("streamed"))
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "streamed", data={"listened": True}, source="preprocessing"))
            return whole, (await until_result(scheduler, "streamed"))[1]
        finally:
            await scheduler.stop()

    whole, streamed = run(main())
    assert word_errors(sample_text("largest_planet"), whole.data["transcript"].text)[0] == 0, whole.data
    assert word_errors(sample_text("spider_legs"), streamed.data["transcript"].text)[0] == 0, streamed.data
    assert len(made) == 1  # both decoded by the one model


@pytest.mark.slow  # real processes, Whisper base in the stage's process
@pytest.mark.timeout(300)
def test_the_listening_half_transcribes_a_streamed_question_while_it_comes_and_a_whole_one(tmp_path: Path) -> None:
    """The voice assistant's entry and asr as its topology wires them: a streamed input goes on
    from the entry to asr chunk by chunk (words before its end), a whole question as before."""
    from benchmarks.eval.samples import sample_request

    whisper_base_dir()
    audio = speech("capital_of_france")

    async def main() -> tuple[list[str], int, Any, Any, dict[str, Any]]:
        async with Pipeline.launch(LISTENING, device="cpu", run_dir=tmp_path, profile=False) as pipe:
            request = await pipe.submit(None, ["transcript"], input_stream=True)
            ended = asyncio.Event()

            async def feed() -> None:
                pcm = float_to_pcm16_bytes(audio)  # as a realtime session sends it: PCM16 at 24 kHz
                for offset in range(0, len(pcm), 2 * CHUNK):
                    await request.send(pcm[offset : offset + 2 * CHUNK])
                    await asyncio.sleep(0.1)  # real time
                await request.end_input()
                ended.set()

            feeder = asyncio.create_task(feed())
            deltas: list[str] = []
            during = 0
            async for event in request.events():
                if event.kind is omnictl.RequestEventKind.STREAM:
                    deltas.append(event.data.text)
                    during += not ended.is_set()
            await feeder
            streamed = (await request.result())["transcript"]
            whole_request = await pipe.submit(sample_request("largest_planet"), ["transcript"])
            whole = (await whole_request.result())["transcript"]
            return deltas, during, streamed, whole, await pipe.held()

    deltas, during, streamed, whole, held = asyncio.run(main())
    assert during >= 1, deltas  # words came while the input was still streaming
    assert "".join(deltas) == streamed.text
    assert word_errors(sample_text("capital_of_france"), streamed.text)[0] == 0, streamed.text
    assert word_errors(sample_text("largest_planet"), whole.text)[0] == 0, whole.text
    figures = [*held["coordinator"].values(), *held["admission"].values(),
               *(v for stage in held["stages"].values() for v in stage.values())]
    assert not any(figures), json.dumps(held)  # nothing left behind


class GatedDecoder:
    """A test double for Whisper alone: hears nothing; notes each decode's loudness (which
    request it was), and holds the first decode until ``gate`` is set."""

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()
        self.levels: list[float] = []

    def encode_text(self, text: str) -> list[int]:
        return []

    def text(self, tokens: list[int]) -> str:
        return ""

    def starts_word(self, token: int) -> bool:
        return True

    def decode(self, audio: np.ndarray, **_: Any) -> list[int]:
        self.levels.append(round(float(np.abs(audio).max()), 1))
        assert self.gate.wait(30)
        return []


def test_a_tentative_transcript_goes_ahead_of_other_sessions_passes() -> None:
    """Three sessions on one Whisper (issue 46, Build 4): while c's pass runs, a's audio waits
    for a pass and b asks for its transcript so far (a pause); b's decode is next, before a's
    pass, though a asked first. Before, jobs ran in the order asked."""
    decoder = GatedDecoder()

    def pcm(level: float) -> bytes:
        return float_to_pcm16_bytes(np.full(RATE // 2, level, np.float32))  # 500 ms: a pass's worth

    async def main() -> None:
        scheduler = StreamingAsrScheduler(decoder, IncrementalSettings(cadence_s=0.4))  # type: ignore[arg-type]  # the test double
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(chunk("c", pcm(0.1)))
            while not decoder.levels:  # c's pass is running, held
                await asyncio.sleep(0.01)
            scheduler.inbox.put_nowait(chunk("a", pcm(0.2)))
            scheduler.inbox.put_nowait(chunk("b", pcm(0.5)))
            scheduler.inbox.put_nowait(chunk("b", {"tentative": True}))
            while not scheduler.inbox.empty():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # taken: a and b wait for the worker
            decoder.gate.set()
            await idle(scheduler)
        finally:
            await scheduler.stop()

    run(main())
    assert decoder.levels[:3] == [0.1, 0.5, 0.2], decoder.levels  # c's, then b's tentative, then a's pass

