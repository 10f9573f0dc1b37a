"""CSM's backbone stage: the slow autoregressive model over frames.

Each step reads one whole frame (every codebook's embedding, summed) and scores the next
frame's first codebook; the scheduler picks it and streams it, with the backbone's last
hidden state, to the depth decoder (``stream_to``), which makes the rest of the frame and
hands it back (:mod:`omnictl.models.csm.frames`). Only then may the request step again:
the runner is stream-fed and is not ``ready`` while its frame is out.

It ends as transformers' ``CsmForConditionalGeneration.generate`` ends: at ``max_tokens``
frames, or after a frame whose codebooks (all but the last) are all the end-of-audio code.
That test needs the whole frame, which the backbone has only once the depth decoder gave
it back; the runner then answers with scores for one extra token, :attr:`BackboneRunner.end_id`
(past the codebook), the only stop token the scheduler knows, so the request stops there
and the end frame is neither streamed nor counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from omnictl.inputs import SPEECH_SAMPLING
from omnictl.models.csm import frames
from omnictl.models.csm.model import load_csm
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput

# transformers' CSM generation defaults (sesame/csm-1b's generation_config): a request's
# own sampling is laid over them; max_tokens counts frames (80 ms each).
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 50, "max_tokens": 125}


@dataclass(slots=True)
class _State:
    cache: Any
    waiting: bool = False  # a code is out at the depth decoder: no step until its frame is back
    frame: torch.Tensor | None = None  # [codebooks]: the frame the next step reads
    ended: bool = False  # that frame is the end of the audio


class BackboneRunner:
    """The backbone of a CSM checkpoint as an autoregressive, stream-fed runner."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        model = load_csm(model_path, device)
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config
        self.codebooks = int(config.num_codebooks)
        self.end_code = int(config.codebook_eos_token_id)
        self.end_id = int(config.vocab_size)  # one past the codebook: "the audio has ended"
        self._states: dict[str, _State] = {}

    def _scores(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.lm_head(hidden).float()
        return torch.cat([logits, torch.full((1,), float("-inf"), device=logits.device)])

    def _forward(self, state: _State, **inputs: Any) -> StepOutput:
        out = self.model.backbone_model(cache=state.cache, use_cache=True, **inputs)
        hidden = out.last_hidden_state[0, -1]
        state.waiting = True
        return StepOutput(logits=self._scores(hidden), hidden=hidden)

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        from transformers import DynamicCache

        ids = torch.as_tensor(inputs["input_ids"], dtype=torch.long).reshape(1, -1).to(self.device)
        state = self._states[request_id] = _State(cache=DynamicCache(config=self.model.config))
        # A text-only prompt's embeddings, as CsmForConditionalGeneration makes them.
        output = self._forward(state, inputs_embeds=self.model.embed_text_tokens(ids))
        output.prompt_tokens = int(ids.shape[1])
        return output

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        # One request at a time: each has a cache of its own length (the HF reference runner).
        return [self._step(rid, token) for rid, token in zip(request_ids, token_ids)]

    def _step(self, request_id: str, token: int) -> StepOutput:
        state = self._states[request_id]
        frame = state.frame
        if frame is None or int(frame[0]) != token:
            raise RuntimeError(f"CSM backbone: the frame handed back for code {token} is {frame}")
        state.frame = None
        if state.ended:
            state.waiting = False
            ended = torch.full((self.end_id + 1,), float("-inf"), device=self.device)
            ended[self.end_id] = 0.0
            return StepOutput(logits=ended)
        return self._forward(state, input_ids=frame.reshape(1, 1, -1).to(self.device))

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        state = self._states.get(request_id)
        if state is None or data is None:
            return
        frame = torch.as_tensor(data["frame"], dtype=torch.long).reshape(-1)
        if frame.shape[0] != self.codebooks:
            raise ValueError(f"CSM backbone: a frame has {self.codebooks} codes, got {frame.shape[0]}")
        state.frame = frame
        state.ended = bool((frame[:-1] == self.end_code).all())
        state.waiting = False

    def ready(self, request_id: str) -> bool:
        state = self._states.get(request_id)
        return state is None or not state.waiting

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {self.end_id}

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return ""  # codes, not text

    def kv_slots(self) -> int:
        return len(self._states)


def speech_sampling(params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A request's sampling: a chat request's ``sampling``, or a speech request's (``/v1/audio/speech``)."""
    own = params.get("sampling")
    return own if own is not None else params.get(SPEECH_SAMPLING)


class BackboneScheduler(AutoregressiveScheduler):
    runner: BackboneRunner

    def __init__(self, runner: BackboneRunner, *, max_batch: int = 32, sampling: Mapping[str, Any]) -> None:
        super().__init__(runner, emit_hidden=True, max_batch=max_batch, default_sampling=sampling)

    def request_sampling(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return speech_sampling(params)

    async def start(self) -> None:
        await super().start()
        import asyncio

        frames.register(self.stage_name or "backbone", self, asyncio.get_running_loop())

    async def stop(self) -> None:
        frames.unregister(self.stage_name or "backbone", self)
        await super().stop()
