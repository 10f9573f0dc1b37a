"""The vocoder stage's chunking: the first audio chunk after ``first_chunk_frames`` codec
frames, then one every ``chunk_frames``; the samples are the same however they are cut."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch

from omnictl.models.qwen3_omni.code2wav import Code2WavScheduler, Vocoder
from omnictl.models.qwen3_omni.payloads import TalkerDelta, TalkerResult
from omnictl.models.qwen3_omni.tiny import SIZES
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


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
                await asyncio.sleep(0.05)  # the vocoder runs in its thread
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


def test_streams_due_together_are_vocoded_in_one_call_with_the_samples_of_each_alone(tiny_qwen: Path) -> None:
    tiny = SIZES["tiny"]
    generator = torch.Generator().manual_seed(1)
    codes = {rid: torch.randint(0, tiny.codebook, (n, tiny.code_groups), generator=generator)
             for rid, n in (("a", 7), ("b", 13))}  # different lengths: the shorter is padded
    alone = {rid: run(tiny_qwen, c, chunk_frames=4, first_chunk_frames=2)[-1][1] for rid, c in codes.items()}

    async def together() -> tuple[dict[str, np.ndarray], list[int]]:
        vocoder = Vocoder(str(tiny_qwen), "cpu")
        batch_sizes: list[int] = []
        real = vocoder.samples_batch

        def counting(items):  # type: ignore[no-untyped-def]
            batch_sizes.append(len(items))
            return real(items)

        vocoder.samples_batch = counting  # type: ignore[method-assign]
        scheduler = Code2WavScheduler(vocoder, chunk_frames=4, first_chunk_frames=2)
        for rid, c in codes.items():  # both waiting before the scheduler looks: one burst
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, rid, TalkerResult(
                token_ids=[], text="", codes=c), "talker_ar", {}))
        await scheduler.start()
        results: dict[str, np.ndarray] = {}
        try:
            while len(results) < 2:
                message = await asyncio.wait_for(scheduler.outbox.get(), 10)
                if message.kind is OutgoingKind.RESULT:
                    results[message.request_id] = message.data.samples
        finally:
            await scheduler.stop()
        return results, batch_sizes

    results, batch_sizes = asyncio.run(together())
    assert batch_sizes == [2]
    for rid in codes:
        np.testing.assert_allclose(results[rid], alone[rid], atol=1e-5)
