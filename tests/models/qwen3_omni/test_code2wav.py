"""The vocoder stage's chunking: the first audio chunk after ``first_chunk_frames`` codec
frames, then one every ``chunk_frames``; the samples are the same however they are cut."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from omnictl.models.qwen3_omni.code2wav import Code2WavScheduler, Vocoder
from omnictl.models.qwen3_omni.payloads import TalkerDelta, TalkerResult
from omnictl.models.qwen3_omni.tiny import SIZES
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


async def settled(scheduler: Code2WavScheduler) -> None:
    """Until the scheduler has handled everything put on its inbox, vocoding included."""
    while not scheduler.inbox.empty():  # empty: its task took the message and ran up to the vocoder call
        await asyncio.sleep(0)
    # The vocoder's single worker thread runs calls in order: once a no-op there is done, so
    # is the synthesis submitted before it; one more loop turn lets the scheduler emit.
    await asyncio.get_running_loop().run_in_executor(scheduler._executor, lambda: None)
    await asyncio.sleep(0)


def run(model_path: Path, codes: torch.Tensor, **chunking: int) -> list[tuple[int, np.ndarray]]:
    """Feed ``codes`` one frame per stream chunk, then the final result; returns, per audio
    output, how many frames had been sent when it came, and its samples."""

    async def scenario() -> list[tuple[int, np.ndarray]]:
        scheduler = Code2WavScheduler(Vocoder(str(model_path), "cpu"), **chunking)
        await scheduler.start()
        out: list[tuple[int, np.ndarray]] = []
        try:
            for sent in range(1, codes.shape[0] + 1):
                delta = TalkerDelta(token_ids=[], text="", codes=codes[sent - 1 : sent])
                scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "r", delta, "talker_ar", {}))
                await settled(scheduler)
                while not scheduler.outbox.empty():
                    out.append((sent, scheduler.outbox.get_nowait().data.samples))
            final = TalkerResult(token_ids=[], text="", codes=codes)
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", final, "talker_ar", {}))
            while True:
                message = await asyncio.wait_for(scheduler.outbox.get(), 10)
                if message.kind is OutgoingKind.RESULT:
                    out.append((-1, message.data.samples))
                    return out
                out.append((codes.shape[0], message.data.samples))
        finally:
            await scheduler.stop()

    return asyncio.run(scenario())


def test_the_first_chunk_comes_after_first_chunk_frames_and_the_samples_do_not_change(tiny_qwen: Path) -> None:
    tiny = SIZES["tiny"]
    codes = torch.randint(0, tiny.codebook, (9, tiny.code_groups), generator=torch.Generator().manual_seed(0))
    early = run(tiny_qwen, codes, chunk_frames=4, first_chunk_frames=1)
    late = run(tiny_qwen, codes, chunk_frames=4)
    assert [sent for sent, _ in early[:3]] == [1, 5, 9]  # 1 frame, then every 4
    assert [sent for sent, _ in late[:2]] == [4, 8]
    for chunks in (early, late):
        streamed = np.concatenate([samples for sent, samples in chunks if sent != -1])
        np.testing.assert_allclose(streamed, chunks[-1][1], atol=1e-6)  # the result is the chunks joined
    np.testing.assert_allclose(early[-1][1], late[-1][1], atol=1e-5)


class SlowVocoder:
    """A test double for the vocoder: 0.1 s per call, one second of silence per frame."""

    samples_per_frame = 24_000

    def samples(self, codes: torch.Tensor, end: int, emitted: int) -> tuple[np.ndarray, int]:
        import time

        time.sleep(0.1)
        return np.zeros(end * self.samples_per_frame - emitted, dtype=np.float32), end * self.samples_per_frame


def frames(n: int) -> TalkerDelta:
    return TalkerDelta(token_ids=[], text="", codes=torch.zeros(n, 4, dtype=torch.long))


@pytest.mark.parametrize(("policy", "order"), [("fifo", ["a", "a", "b"]), ("deadline", ["a", "b", "a"])])
def test_the_stream_with_less_slack_is_vocoded_first(policy: str, order: list[str]) -> None:
    """a plays 2 s of audio when b's first frames and a's next chunk are both due: under
    `deadline` b (its first chunk due 0.5 s after it came) goes first, under `fifo` a."""

    async def scenario() -> list[str]:
        scheduler = Code2WavScheduler(SlowVocoder(), chunk_frames=3, first_chunk_frames=2,  # type: ignore[arg-type]
                                      audio_policy=policy, ttfp_target_s=0.5)
        await scheduler.start()
        try:
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "a", frames(2), "talker_ar", {}))
            await asyncio.sleep(0.03)  # a's first chunk is being vocoded
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "a", frames(3), "talker_ar", {}))
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "b", frames(2), "talker_ar", {}))
            out = []
            for _ in order:
                message = await asyncio.wait_for(scheduler.outbox.get(), 10)
                assert message.kind is OutgoingKind.STREAM
                out.append(message.request_id)
            return out
        finally:
            await scheduler.stop()

    assert asyncio.run(scenario()) == order
