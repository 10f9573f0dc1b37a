"""Run the Qwen3-Omni stages in one process, wired as topologies/qwen3-omni.yaml wires them.

A test double for the runtime's Stage/transport layer only: the stage functions and
schedulers are the real ones; messages are handed over directly, in the order a
Stage sends them (stream chunks, then the result, then stream-done).
"""

from __future__ import annotations

import asyncio
from typing import Any

from omnictl.models.qwen3_omni import stages
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, Scheduler


class InProcessQwen:
    def __init__(self, model_path: str, *, talker_kwargs: dict[str, Any] | None = None, chunk_frames: int = 4) -> None:
        self.pre = stages.preprocessing(model_path)
        self.audio = stages.audio_encoder(model_path, "cpu")
        self.image = stages.image_encoder(model_path, "cpu")
        self.aggregate = stages.mm_aggregate(model_path, "cpu")
        self.thinker = stages.thinker(model_path, "cpu")
        self.decode = stages.decode(model_path)
        self.talker = stages.talker_ar(model_path, "cpu", **(talker_kwargs or {}))
        self.code2wav = stages.code2wav(model_path, "cpu", chunk_frames=chunk_frames)
        self.schedulers: list[Scheduler] = [self.thinker, self.decode, self.talker, self.code2wav]

    async def __aenter__(self) -> InProcessQwen:
        for scheduler in self.schedulers:
            scheduler.stage_name = type(scheduler).__name__
            await scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for scheduler in self.schedulers:
            await scheduler.stop()

    async def run(self, inputs: dict[str, Any], request_id: str = "r1", timeout: float = 120.0) -> dict[str, Any]:
        params = {"sampling": inputs.get("sampling", {}), "voice": inputs.get("voice"), "modalities": ["text", "audio"]}
        front = self.pre(inputs)
        merged = stages.merge_multimodal(
            {"preprocessing": front, "audio_encoder": self.audio(front), "image_encoder": self.image(front)}
        )
        aggregated = self.aggregate(merged)
        await self.thinker.inbox.put(IncomingMessage(IncomingKind.NEW_REQUEST, request_id, aggregated, params=params))
        events: dict[str, list[Any]] = {"text_stream": [], "audio_stream": [], "talker_stream": []}
        results: dict[str, Any] = {}

        async def pump_thinker() -> None:
            while True:
                out = await self.thinker.outbox.get()
                assert out.kind is not OutgoingKind.ERROR, out.error
                if out.kind is OutgoingKind.STREAM:
                    for target in (self.decode, self.talker):
                        await target.inbox.put(
                            IncomingMessage(IncomingKind.STREAM_CHUNK, request_id, out.data, "thinker", params)
                        )
                else:
                    results["thinker"] = out.data
                    await self.decode.inbox.put(
                        IncomingMessage(IncomingKind.NEW_REQUEST, request_id, stages.project_for_decode(out.data), "thinker", params)
                    )
                    await self.talker.inbox.put(IncomingMessage(IncomingKind.NEW_REQUEST, request_id, out.data, "thinker", params))
                    for target in (self.decode, self.talker):
                        await target.inbox.put(IncomingMessage(IncomingKind.STREAM_DONE, request_id, None, "thinker", params))
                    return

        async def pump_talker() -> None:
            while True:
                out = await self.talker.outbox.get()
                assert out.kind is not OutgoingKind.ERROR, out.error
                if out.kind is OutgoingKind.STREAM:
                    events["talker_stream"].append(out.data)
                    await self.code2wav.inbox.put(IncomingMessage(IncomingKind.STREAM_CHUNK, request_id, out.data, "talker_ar", params))
                else:
                    results["talker_ar"] = out.data
                    await self.code2wav.inbox.put(IncomingMessage(IncomingKind.NEW_REQUEST, request_id, out.data, "talker_ar", params))
                    return

        async def collect(scheduler: Scheduler, name: str, stream_key: str) -> None:
            while True:
                out = await scheduler.outbox.get()
                assert out.kind is not OutgoingKind.ERROR, out.error
                if out.kind is OutgoingKind.STREAM:
                    events[stream_key].append(out.data)
                else:
                    results[name] = out.data
                    return

        await asyncio.wait_for(
            asyncio.gather(
                pump_thinker(),
                pump_talker(),
                collect(self.decode, "decode", "text_stream"),
                collect(self.code2wav, "code2wav", "audio_stream"),
            ),
            timeout,
        )
        return {**results, **events}
