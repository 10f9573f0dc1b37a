"""The text terminal forwards the thinker's deltas and reports the terminal result convention."""

from __future__ import annotations

from omnictl.models.voice_assistant.text_terminal import TextTerminalScheduler
from omnictl.outputs import FinishReason, TextDelta, TextResult, TokenDelta, TokenResult
from omnictl.schedulers.base import IncomingKind, OutgoingKind

from .conftest import drained, incoming, next_out, run, until_result

THINKER_RESULT = TokenResult(token_ids=[5, 6, 7], text="Paris is lovely.", prompt_tokens=12, completion_tokens=4, finish_reason=FinishReason.STOP)


def test_deltas_stream_through_and_the_result_follows_the_convention() -> None:
    async def main() -> None:
        scheduler = TextTerminalScheduler()
        await scheduler.start()
        try:
            for delta in ("Paris", " is", " lovely."):
                scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=delta, token_ids=[1])))
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_DONE, "r"))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", THINKER_RESULT))
            streamed, result = await until_result(scheduler, "r")
            # struct equality is type-strict: plain TextDelta / TextResult, the thinker's token ids dropped
            assert [m.data for m in streamed] == [TextDelta(text="Paris"), TextDelta(text=" is"), TextDelta(text=" lovely.")]
            assert result.kind is OutgoingKind.RESULT
            assert type(result.data) is TextResult
            assert result.data == TextResult(text="Paris is lovely.", prompt_tokens=12, completion_tokens=4, finish_reason=FinishReason.STOP)
            assert scheduler.load().running == 0
        finally:
            await scheduler.stop()

    run(main())


def test_a_result_that_overtakes_its_chunks_sends_the_missing_text_once() -> None:
    async def main() -> None:
        scheduler = TextTerminalScheduler()
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text="Paris")))
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", THINKER_RESULT))
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text=" is")))  # late: ignored
            streamed, result = await until_result(scheduler, "r")
            assert all(type(m.data) is TextDelta for m in streamed)
            assert "".join(m.data.text for m in streamed) == "Paris is lovely."
            assert type(result.data) is TextResult and result.data.text == "Paris is lovely."
            await drained(scheduler)
            assert scheduler.outbox.empty()
            assert scheduler.load().running == 0 and scheduler.load().stream_buffers == 0
        finally:
            await scheduler.stop()

    run(main())


def test_abort_forgets_the_request_and_ignores_what_comes_later() -> None:
    async def main() -> None:
        scheduler = TextTerminalScheduler()
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.STREAM_CHUNK, "r", TokenDelta(text="Par")))
            await next_out(scheduler)
            scheduler.abort("r")
            assert scheduler.load().running == 0
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", THINKER_RESULT))
            await drained(scheduler)
            assert scheduler.outbox.empty() and scheduler.load().running == 0
        finally:
            await scheduler.stop()

    run(main())


def test_a_result_without_text_fails_naming_what_it_got() -> None:
    async def main() -> None:
        scheduler = TextTerminalScheduler()
        scheduler.stage_name = "decode"
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(incoming(IncomingKind.NEW_REQUEST, "r", {"token_ids": [1]}))
            error = await next_out(scheduler)
            assert error.kind is OutgoingKind.ERROR
            assert "stage decode" in (error.error or "") and "['token_ids']" in (error.error or "")
            assert "expected the upstream's result to be a TextResult" in (error.error or "")
        finally:
            await scheduler.stop()

    run(main())
