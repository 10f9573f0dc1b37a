"""The transcript terminal hands on asr's streamed segments and then what asr heard."""

from __future__ import annotations

from omnictl.models.voice_assistant.transcript_terminal import TranscriptTerminalScheduler
from omnictl.outputs import Transcript, TranscriptSegment
from omnictl.schedulers.base import IncomingKind, OutgoingKind

from .conftest import drained, incoming, run, until_result


def segment(i: int, text: str) -> TranscriptSegment:
    return TranscriptSegment(id=i, start=float(i), end=i + 0.9, text=text)


HEARD = Transcript(text="Hello there. Bye.", language="en", duration=2.0,
                   segments=[segment(0, " Hello there."), segment(1, " Bye.")])


def test_segments_stream_then_the_result_and_late_chunks_are_dropped() -> None:
    async def main() -> None:
        scheduler = TranscriptTerminalScheduler()
        await scheduler.start()
        try:
            first = Transcript(text=" Hello there.", language="en", segments=[HEARD.segments[0]])
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", first))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", {"messages": [], "transcript": HEARD}))
            late = Transcript(text=" Bye.", language="en", segments=[HEARD.segments[1]])
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", late))  # after the result: dropped
            streamed, result = await until_result(scheduler, "r")
            assert [m.data for m in streamed] == [first]
            assert result.kind is OutgoingKind.RESULT and result.data == HEARD
            await drained(scheduler)
            assert scheduler.outbox.empty()
        finally:
            await scheduler.stop()

    run(main())


def test_a_chunk_that_is_not_a_transcript_fails_the_request() -> None:
    async def main() -> None:
        scheduler = TranscriptTerminalScheduler()
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", {"text": "hi"}))
            _, error = await until_result(scheduler, "r")
            assert error.kind is OutgoingKind.ERROR and "expected Transcript" in (error.error or "")
        finally:
            await scheduler.stop()

    run(main())
