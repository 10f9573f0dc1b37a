"""The streaming scheduler, driven through its inbox/outbox."""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np
import pytest

from omnictl.outputs import AudioChunk, AudioResult, TextDelta, TextResult
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingMessage
from omnictl.schedulers.streaming import StreamingScheduler, Window, merge_outputs
from tests.schedulers.harness import Outcome, pump, wait_for_condition
from tests.support.wait import run

KERNEL = np.array([0.5, -0.25, 0.125])  # a causal filter: each sample needs the 2 units before it


def chunk(rid: str, data: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_CHUNK, rid, data, source="up", params={"voice": "v"})


def done(rid: str) -> IncomingMessage:
    return IncomingMessage(IncomingKind.STREAM_DONE, rid, None, source="up")


def final_result(rid: str, data: Any) -> IncomingMessage:
    return IncomingMessage(IncomingKind.NEW_REQUEST, rid, data, params={"voice": "v"})


def filtered(codes: np.ndarray) -> np.ndarray:
    """The whole-sequence reference: the causal filter over all codes at once."""
    return np.convolve(codes, KERNEL)[: len(codes)]


class ToyVocoder:
    """Stands in for code2wav: output for new units depends on the units before them."""

    def __init__(self) -> None:
        self.windows: list[Window] = []

    def __call__(self, window: Window) -> dict[str, Any]:
        self.windows.append(window)
        joined = np.concatenate([np.asarray(window.context, dtype=float), np.asarray(window.new, dtype=float)])
        audio = np.convolve(joined, KERNEL)[len(window.context) : len(joined)]
        return {"audio": audio, "sample_rate": 24000}


class Counted(StreamingScheduler):
    """Counts what its callbacks emit (from the worker thread) and what has landed in the
    outbox (on the loop), so that a test can wait for the one to catch up with the other."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.emitted = 0
        self.landed = 0
        self._count_lock = threading.Lock()

    def emit(self, message: OutgoingMessage) -> None:
        with self._count_lock:
            self.emitted += 1
        super().emit(message)

    async def start(self) -> None:
        await super().start()
        put = self.outbox.put_nowait

        def landing(message: OutgoingMessage) -> None:
            put(message)
            self.landed += 1

        self.outbox.put_nowait = landing  # type: ignore[method-assign,assignment]


async def settle(scheduler: Counted) -> None:
    """Wait until every message was taken in, every callback ran and all they emitted landed."""
    await wait_for_condition(lambda: scheduler.inbox.empty() and scheduler.load().queued == 0
                             and scheduler.landed == scheduler.emitted)


def test_vocoder_windows_carry_left_context_and_match_the_whole_sequence() -> None:
    codes = np.arange(1, 15, dtype=float) ** 1.5
    arrivals = [1, 1, 4, 2, 5, 1]  # chunk sizes as the upstream streams them
    vocoder = ToyVocoder()

    async def scenario() -> tuple[dict[str, Outcome], list[int]]:
        scheduler = Counted(vocoder, left_context=2, chunk_size=3, units="codes")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        emitted_after_each_chunk = []
        try:
            start = 0
            for size in arrivals:
                scheduler.inbox.put_nowait(chunk("r", {"codes": codes[start : start + size]}))
                start += size
                await settle(scheduler)
                await pump(scheduler, outcomes, lambda: scheduler.outbox.empty(), timeout=5)
                emitted_after_each_chunk.append(len(outcomes.get("r", Outcome()).chunks))
            scheduler.inbox.put_nowait(done("r"))
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            return outcomes, emitted_after_each_chunk
        finally:
            await scheduler.stop()

    outcomes, emitted = run(scenario())
    # 1, 2 units: not enough; 6: one window of 3 (3 wait); 8: a second; 13: a third (4 wait) ...
    assert emitted == [0, 0, 2, 2, 4, 4]
    assert [len(w.new) for w in vocoder.windows] == [3, 3, 3, 3, 2]
    assert [len(w.context) for w in vocoder.windows] == [0, 2, 2, 2, 2]
    assert [w.final for w in vocoder.windows] == [False] * 4 + [True]
    for window in vocoder.windows[1:]:
        assert window.params == {"voice": "v"}
        np.testing.assert_array_equal(window.context, codes[3 * window.index - 2 : 3 * window.index])
    streamed = np.concatenate([c["audio"] for c in outcomes["r"].chunks])
    np.testing.assert_allclose(streamed, filtered(codes))
    np.testing.assert_allclose(outcomes["r"].result["audio"], filtered(codes))
    assert outcomes["r"].result["sample_rate"] == 24000


def test_without_left_context_windows_lose_the_boundary() -> None:
    # The knob matters: with no context the filter restarts at every window.
    codes = np.arange(1, 10, dtype=float)

    async def scenario() -> Outcome:
        scheduler = StreamingScheduler(ToyVocoder(), left_context=0, chunk_size=3, units="codes")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(chunk("r", {"codes": codes}))
            scheduler.inbox.put_nowait(done("r"))
            await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            return outcomes["r"]
        finally:
            await scheduler.stop()

    result = run(scenario()).result["audio"]
    assert not np.allclose(result, filtered(codes))
    np.testing.assert_allclose(result[:3], filtered(codes)[:3])


def first_sentence(text: str) -> int:
    """Length of the first whole sentence of ``text`` (ended by '.', '!' or '?' and a space), or 0."""
    end = re.search(r"[.!?](?=\s)", text)
    return end.end() if end else 0


def test_text_is_spoken_sentence_by_sentence_while_it_streams_in() -> None:
    spoken: list[str] = []

    def speak(window: Window) -> dict[str, Any]:
        spoken.append(window.new)
        return {"audio": np.full(len(window.new), 0.1, dtype=np.float32), "sample_rate": 16000, "transcript": window.new}

    deltas = ["Hello wor", "ld. How are", " you? I am", " fine. Thanks. And", " you"]

    async def scenario() -> tuple[Outcome, list[int]]:
        scheduler = Counted(speak, split=first_sentence, units="text", finish_on="request")
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        seen = []
        try:
            for delta in deltas:
                scheduler.inbox.put_nowait(chunk("r", {"text": delta, "token_ids": [1]}))
                await settle(scheduler)
                await pump(scheduler, outcomes, lambda: scheduler.outbox.empty(), timeout=5)
                seen.append(len(outcomes.get("r", Outcome()).chunks))
            scheduler.inbox.put_nowait(done("r"))  # finish_on="request": not the end yet
            await settle(scheduler)
            await pump(scheduler, outcomes, lambda: scheduler.outbox.empty(), timeout=5)
            assert outcomes["r"].result is None
            scheduler.inbox.put_nowait(final_result("r", {"text": "".join(deltas)}))
            await pump(scheduler, outcomes, lambda: outcomes["r"].done)
            return outcomes["r"], seen
        finally:
            await scheduler.stop()

    outcome, seen = run(scenario())
    assert seen == [0, 1, 2, 4, 4]  # the first sentence is spoken before the text is complete
    assert spoken == ["Hello world.", " How are you?", " I am fine.", " Thanks.", " And you"]
    assert outcome.result["transcript"] == "".join(deltas)
    assert outcome.result["audio"].shape == (len("".join(deltas)),)


def test_finish_on_stream_done_ignores_the_later_result_and_request_mode_takes_a_whole_input() -> None:
    calls: list[str] = []

    def upper(window: Window) -> dict[str, Any]:
        calls.append(window.new)
        return {"text": window.new.upper()}

    async def scenario() -> dict[str, Outcome]:
        stream_mode = Counted(upper, units="text", chunk_size=100)
        request_mode = StreamingScheduler(upper, units="text", chunk_size=100, finish_on="request")
        outcomes: dict[str, Outcome] = {}
        for scheduler in (stream_mode, request_mode):
            await scheduler.start()
        try:
            stream_mode.inbox.put_nowait(chunk("s", {"text": "abc"}))
            stream_mode.inbox.put_nowait(done("s"))
            stream_mode.inbox.put_nowait(final_result("s", {"text": "abc"}))  # after the end: ignored
            request_mode.inbox.put_nowait(final_result("w", {"text": "whole"}))  # nothing streamed
            await pump(stream_mode, outcomes, lambda: "s" in outcomes and outcomes["s"].done)
            await pump(request_mode, outcomes, lambda: "w" in outcomes and outcomes["w"].done)
            await settle(stream_mode)
            await pump(stream_mode, outcomes, lambda: stream_mode.outbox.empty(), timeout=5)
            return outcomes
        finally:
            for scheduler in (stream_mode, request_mode):
                await scheduler.stop()

    outcomes = run(scenario())
    assert outcomes["s"].result == {"text": "ABC"} and len(outcomes["s"].chunks) == 1
    assert outcomes["w"].result == {"text": "WHOLE"}
    assert sorted(calls) == ["abc", "whole"]


def test_abort_drops_the_buffer_and_a_failing_callback_fails_only_its_request() -> None:
    def picky(window: Window) -> dict[str, Any]:
        if "boom" in window.new:
            raise ValueError("cannot say boom")
        return {"text": window.new}

    async def scenario() -> tuple[dict[str, Outcome], list[int]]:
        scheduler = Counted(picky, units="text", chunk_size=4)
        scheduler.stage_name = "tts"
        await scheduler.start()
        outcomes: dict[str, Outcome] = {}
        try:
            scheduler.inbox.put_nowait(chunk("aborted", {"text": "ab"}))
            scheduler.inbox.put_nowait(chunk("bad", {"text": "boom"}))
            scheduler.inbox.put_nowait(chunk("good", {"text": "fine"}))
            await settle(scheduler)
            buffers = [scheduler.load().stream_buffers]
            scheduler.abort("aborted")
            buffers.append(scheduler.load().stream_buffers)
            for rid in ("aborted", "bad", "good"):
                scheduler.inbox.put_nowait(chunk(rid, {"text": "more"}))
                scheduler.inbox.put_nowait(done(rid))
            await pump(scheduler, outcomes, lambda: all(r in outcomes and outcomes[r].done for r in ("bad", "good")))
            await settle(scheduler)
            await pump(scheduler, outcomes, lambda: scheduler.outbox.empty(), timeout=5)
            buffers.append(scheduler.load().stream_buffers)
            return outcomes, buffers
        finally:
            await scheduler.stop()

    outcomes, buffers = run(scenario())
    assert buffers == [3, 2, 0]
    assert "aborted" not in outcomes
    assert "tts" in outcomes["bad"].error and "cannot say boom" in outcomes["bad"].error
    assert outcomes["bad"].result is None
    assert outcomes["good"].result == {"text": "finemore"}


def test_merge_outputs_joins_audio_chunks_into_an_audio_result() -> None:
    merged = merge_outputs(
        [
            AudioChunk(samples=np.ones(2, dtype=np.float32), sample_rate=16000, transcript="Hi. "),
            AudioChunk(samples=np.zeros(3, dtype=np.float32), sample_rate=16000, transcript="Bye."),
        ]
    )
    assert isinstance(merged, AudioResult)
    np.testing.assert_array_equal(merged.samples, [1, 1, 0, 0, 0])
    assert merged.sample_rate == 16000 and merged.transcript == "Hi. Bye."


def test_merge_outputs_joins_text_deltas_and_dicts_key_by_key() -> None:
    assert merge_outputs([TextDelta(text="a"), TextDelta(text="b")]) == TextResult(text="ab")
    merged = merge_outputs([{"ids": [1], "rate": 1, "raw": np.ones(1)}, {"ids": [2], "rate": 2, "raw": np.zeros(1)}])
    assert merged["ids"] == [1, 2] and merged["rate"] == 2 and merged["raw"].tolist() == [1.0, 0.0]
    with pytest.raises(TypeError, match="cannot merge a TextDelta"):
        merge_outputs([{"a": 1}, TextDelta(text="x")])


def test_flush_on_end_gives_a_look_ahead_codec_its_held_frames_when_nothing_waits() -> None:
    """A stream ending on a window boundary: without flush_on_end no final window is
    called; with it, one empty final window comes, its context the last units."""

    def windows_of(flush: bool) -> list[Window]:
        seen: list[Window] = []

        def hold_one(window: Window) -> dict[str, Any] | None:
            seen.append(window)
            return None

        async def scenario() -> None:
            scheduler = StreamingScheduler(hold_one, left_context=2, chunk_size=2, units="codes", flush_on_end=flush)
            await scheduler.start()
            outcomes: dict[str, Outcome] = {}
            try:
                scheduler.inbox.put_nowait(chunk("r", {"codes": np.arange(4.0)}))
                scheduler.inbox.put_nowait(done("r"))
                await pump(scheduler, outcomes, lambda: "r" in outcomes and outcomes["r"].done)
            finally:
                await scheduler.stop()

        run(scenario())
        return seen

    assert [(len(w.new), w.final) for w in windows_of(False)] == [(2, False), (2, False)]
    flushed = windows_of(True)
    assert [(len(w.new), w.final) for w in flushed] == [(2, False), (2, False), (0, True)]
    np.testing.assert_array_equal(flushed[-1].context, [2.0, 3.0])
    with pytest.raises(ValueError, match="flush_on_end needs left_context"):
        StreamingScheduler(lambda window: None, flush_on_end=True)
