"""The Qwen3-ASR stages in one process, wired as topologies/qwen3-asr.yaml wires them.

A test double for the runtime's Stage/transport layer only: the stage functions and
schedulers are the real ones; messages are handed over directly, in the order a Stage
sends them (stream chunks, then the result, then stream-done).
"""

from __future__ import annotations

import asyncio
from typing import Any

from omnictl.inputs import request_params
from omnictl.models.qwen3_asr import stages
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind


class InProcessAsr:
    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.pre = stages.preprocessing(model_path)
        self.encoder = stages.audio_encoder(model_path, "cpu")

    async def __aenter__(self) -> InProcessAsr:
        # Schedulers' queues belong to one event loop: fresh ones per run (the weights are
        # loaded once per process and shared).
        self.decoder = stages.decoder(self.model_path, "cpu")
        self.transcript = stages.transcript(self.model_path)
        for name, scheduler in (("decoder", self.decoder), ("transcript", self.transcript)):
            scheduler.stage_name = name
            await scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for scheduler in (self.decoder, self.transcript):
            await scheduler.stop()

    async def run(self, inputs: Any, request_id: str = "r1", timeout: float = 60.0) -> dict[str, Any]:
        """{"decoder": its result, "transcript": the terminal's result, "stream": the terminal's chunks}."""
        params = request_params(inputs)
        encoded = self.encoder(self.pre(inputs))
        await self.decoder.inbox.put(IncomingMessage(IncomingKind.NEW_REQUEST, request_id, encoded, params=params))
        out: dict[str, Any] = {"stream": []}

        async def pump_decoder() -> None:
            while True:
                message = await self.decoder.outbox.get()
                assert message.kind is not OutgoingKind.ERROR, message.error
                kind = IncomingKind.STREAM_CHUNK if message.kind is OutgoingKind.STREAM else IncomingKind.NEW_REQUEST
                await self.transcript.inbox.put(IncomingMessage(kind, request_id, message.data, "decoder", params))
                if message.kind is OutgoingKind.RESULT:
                    out["decoder"] = message.data
                    return

        async def collect() -> None:
            while True:
                message = await self.transcript.outbox.get()
                assert message.kind is not OutgoingKind.ERROR, message.error
                if message.kind is OutgoingKind.STREAM:
                    out["stream"].append(message.data)
                else:
                    out["transcript"] = message.data
                    return

        await asyncio.wait_for(asyncio.gather(pump_decoder(), collect()), timeout)
        return out
