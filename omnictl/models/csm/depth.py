"""CSM's depth decoder stage: the fast autoregressive model over one frame's codebooks.

A stream chunk from the backbone carries a frame's first code and the backbone's last
hidden state; the depth decoder makes the frame's other ``codebooks - 1`` codes the way
transformers' ``CsmDepthDecoderForCausalLM.generate`` does (position 0 is the hidden
state, position 1 the first code; each step scores the next codebook with its own head),
then the finished frame goes two ways: back to the backbone, whose next step reads it
(:mod:`omnictl.models.csm.frames`), and on to the Mimi decoder as a stream chunk
(``{"codes": [1, codebooks]}``). The end-of-audio frame goes back (the backbone stops on
it) but not on: transformers' ``output_audio`` decodes the frames before it.

The backbone's result (every first code) ends the request here: the result is every
frame made, ``{"codes": [frames, codebooks]}``, after the last chunk's frame.

Sampling: the request's (``sampling``, or a speech request's), over CSM's defaults; a
greedy request (temperature 0) makes every codebook greedy, as ``do_sample=False`` does.
Frames are made one request at a time, in arrival order, in one worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from omnictl.models.csm import frames
from omnictl.models.csm.backbone import DEFAULT_SAMPLING, speech_sampling
from omnictl.models.csm.model import load_csm
from omnictl.recent import RecentIds
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    SchedulerLoad,
)
from omnictl.schedulers.sampling import HF_ENGINE, HF_FIELDS, Sampler, SamplingParams
from omnictl.schedulers.worker import WorkerScheduler


class DepthDecoder:
    """The depth decoder of a CSM checkpoint: one frame's codes from its first code and the backbone's state."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        model = load_csm(model_path, device)
        self.depth = model.depth_decoder
        self.device = next(self.depth.parameters()).device
        self.codebooks = int(model.config.num_codebooks)
        self.end_code = int(model.config.codebook_eos_token_id)

    @torch.inference_mode()
    def frame(self, first_code: int, hidden: torch.Tensor, sampler: Sampler) -> torch.Tensor:
        """The frame ``[codebooks]`` (int64, CPU) that starts with ``first_code``."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.depth.config)
        codes = [first_code]
        # Position 0 is a placeholder the backbone's hidden state replaces (transformers does the same).
        ids = torch.tensor([[0, first_code]], device=self.device)
        state: torch.Tensor | None = torch.as_tensor(hidden, dtype=torch.float32).reshape(1, -1).to(self.device)
        for _ in range(self.codebooks - 1):
            out = self.depth(
                input_ids=ids, backbone_last_hidden_state=state, cache=cache, use_cache=True, logits_to_keep=1
            )
            code = sampler.sample(out.logits[0, -1])
            codes.append(code)
            ids, state = torch.tensor([[code]], device=self.device), None
        return torch.tensor(codes, dtype=torch.long)


@dataclass(slots=True)
class _Request:
    sampler: Sampler
    made: list[torch.Tensor] = field(default_factory=list)  # frames sent on, [codebooks] each
    failed: bool = False


class DepthScheduler(WorkerScheduler):
    worker_name = "depth"

    def __init__(self, decoder: DepthDecoder, *, backbone: str, sampling: Mapping[str, Any]) -> None:
        super().__init__()
        self.decoder = decoder
        self.backbone = backbone
        self.sampling = dict(sampling)
        self._requests: dict[str, _Request] = {}
        self._ended = RecentIds()  # finished or aborted: late chunks for them are ignored

    def accept(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if message.kind is IncomingKind.STREAM_DONE or rid in self._ended:
            return
        request = self._requests.get(rid)
        if request is None:
            try:
                params = SamplingParams.from_mapping(
                    speech_sampling(message.params), defaults=self.sampling, supported=HF_FIELDS, engine=HF_ENGINE
                )
            except Exception as exc:
                self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {exc}", exc=exc))
                return
            request = self._requests[rid] = _Request(Sampler(params))
        job = self._make if message.kind is IncomingKind.STREAM_CHUNK else self._finish
        if job == self._finish:
            self._ended.add(rid)  # the backbone's result is the request's last message here
        self.submit(job, rid, request, message.data)

    def _make(self, rid: str, request: _Request, delta: Any) -> None:
        if request.failed:
            return
        try:
            hidden = delta.hidden
            for i, first in enumerate(delta.token_ids):
                with self.busy():
                    frame = self.decoder.frame(int(first), hidden[i], request.sampler)
                frames.send_back(self.backbone, rid, {"frame": frame}, source=self.stage_name)
                if bool((frame[:-1] == self.decoder.end_code).all()):
                    continue  # the end of the audio: the backbone stops on it; nothing to hear
                request.made.append(frame)
                self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, {"codes": frame.reshape(1, -1)}))
        except Exception as exc:
            self._fail(rid, request, f"depth decoder failed: {type(exc).__name__}: {exc}", exc)

    def _finish(self, rid: str, request: _Request, _result: Any) -> None:
        if request.failed or self._requests.pop(rid, None) is None:
            return
        codes = torch.stack(request.made) if request.made else torch.zeros(0, self.decoder.codebooks, dtype=torch.long)
        self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, {"codes": codes}))

    def _fail(self, rid: str, request: _Request, reason: str, exc: BaseException) -> None:
        request.failed = True
        self._requests.pop(rid, None)
        self.emit(OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: {reason}", exc=exc))

    def abort(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            request.failed = True  # its queued jobs skip their work
        self._ended.add(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self._requests), stream_buffers=len(self._requests))


def default_sampling() -> dict[str, Any]:
    return {key: value for key, value in DEFAULT_SAMPLING.items() if key != "max_tokens"}
