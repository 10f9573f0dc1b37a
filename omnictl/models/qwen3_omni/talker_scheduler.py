"""The autoregressive scheduler, adapted to the talker.

Three differences from the thinker's: the talker starts on the thinker's first stream
chunk (``start_on="stream"``); its sampling is its own (the request's ``max_tokens``
counts text tokens, not codec frames) except that a greedy request (temperature 0)
makes the talker greedy too; and every output carries the finished codec frames
(``codes``) for ``code2wav``, the result all of them plus the spoken ``transcript``.
"""

from __future__ import annotations

from typing import Any, Mapping

from omnictl.models.qwen3_omni.talker import TalkerRunner
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage


class TalkerScheduler(AutoregressiveScheduler):
    runner: TalkerRunner

    def __init__(self, runner: TalkerRunner, *, sampling: Mapping[str, Any], max_batch: int = 32) -> None:
        super().__init__(runner, start_on="stream", max_batch=max_batch)
        self.talker_sampling = dict(sampling)

    def _create(self, message: IncomingMessage, inputs: Any) -> None:
        requested = message.params.get("sampling") or {}
        sampling = dict(self.talker_sampling)
        if requested.get("temperature") == 0:
            sampling["temperature"] = 0.0
        if requested.get("seed") is not None:
            sampling["seed"] = requested["seed"]
        own = IncomingMessage(message.kind, message.request_id, message.data, message.source, {**message.params, "sampling": sampling})
        self.runner.set_code_sampling(message.request_id, float(sampling.get("temperature", 1.0)) > 0.0)
        super()._create(own, inputs)
        if message.kind is IncomingKind.NEW_REQUEST:
            # Nothing was streamed (the thinker stopped at once): its result is the whole input.
            self._send("feed", message.request_id, (inputs, True))

    def emit(self, message: OutgoingMessage) -> None:
        if message.kind in (OutgoingKind.STREAM, OutgoingKind.RESULT) and isinstance(message.data, dict):
            final = message.kind is OutgoingKind.RESULT
            data = {**message.data, "codes": self.runner.take_frames(message.request_id, final=final)}
            if final:
                data["transcript"] = self.runner.transcript(message.request_id)
            message = OutgoingMessage(message.kind, message.request_id, data)
        super().emit(message)

    def _drop(self, rid: str) -> None:
        super()._drop(rid)
        self.runner.forget(rid)
