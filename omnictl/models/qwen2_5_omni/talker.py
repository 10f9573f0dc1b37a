"""The Qwen2.5-Omni talker as an autoregressive runner fed by the thinker's stream.

It reproduces ``Qwen2_5OmniForConditionalGeneration.generate``'s talker half one step at
a time. The prompt is, per prompt position, the thinker's last hidden state plus its input
embedding; then the speaker's text start token's embedding and the row of the thinker's
first answer token, the last two with the codec pad and start embeddings added. Decode
step ``j`` adds the row of the thinker's token ``j + 1`` to the code's embedding (the text
end token's embedding after the last row, the text pad token's beyond). So a step waits
only until the thinker has fed that token back, not for the whole answer.

The codes are the talker's own tokens (one codebook): the scheduler sends them on to
``token2wav`` as they are sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from omnictl.exceptions import InvalidRequest
from omnictl.models.kv_batch import KV, BatchCache, kv_layers
from omnictl.models.qwen2_5_omni.weights import load_talker
from omnictl.outputs import TokenDelta, TokenResult
from omnictl.schedulers.runner import StepOutput

DEFAULT_SPEAKER = "Chelsie"  # transformers' default


@dataclass(slots=True)
class _Fed:
    """What the thinker has sent for one request so far."""

    prefix: dict[str, Any] | None = None
    tokens: list[int] = field(default_factory=list)  # answer tokens, without a stop token
    replies: list[torch.Tensor] = field(default_factory=list)  # [n, hidden] blocks
    count: int = 0  # reply rows so far
    total: int | None = None  # the thinker's completion_tokens, once it finished
    text: str = ""


@dataclass(slots=True)
class _Running:
    own_cache: KV | None  # None while the batch cache holds this request's rows
    length: int  # cached positions
    rope_delta: int
    step: int = 0  # decode steps done
    history: list[int] = field(default_factory=list)  # every id in the talker's sequence (repetition penalty)


class TalkerRunner:
    """Implements the autoregressive runner protocol plus ``feed`` / ``ready``."""

    def __init__(
        self, model_path: str | Path | None, device: str | None = None, *, repetition_penalty: float = 1.05
    ) -> None:
        parts = load_talker(model_path, device)
        self.config = parts.config.talker_config
        self.talker = parts.talker
        self.thinker_embed = parts.thinker_embed
        self.speakers = {name.lower(): (name, params) for name, params in parts.speakers.items()}
        self.device = self.talker.device
        self.repetition_penalty = repetition_penalty
        c = self.config
        self.stops = {int(c.tts_codec_pad_token_id), int(c.tts_codec_end_token_id)}  # generate's talker_eos_token_id
        self.codec_bos, self.codec_pad, self.codec_mask = (
            c.tts_codec_start_token_id,
            c.tts_codec_pad_token_id,
            c.tts_codec_mask_token_id,
        )
        text = torch.tensor([[c.tts_text_end_token_id, c.tts_text_pad_token_id]], device=self.device)
        with torch.inference_mode():
            self.text_eos, self.text_pad = self.thinker_embed(text)[0]
        self._fed: dict[str, _Fed] = {}
        self._running: dict[str, _Running] = {}
        self._transcripts: dict[str, str] = {}
        self._batch: BatchCache | None = None

    # --- stream input ----------------------------------------------------------------

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        fed = self._fed.setdefault(request_id, _Fed())
        if data is None:
            return  # the thinker's stream ended; its result is still to come
        if not isinstance(data, (TokenDelta, TokenResult)):
            raise TypeError(f"the talker reads the thinker's TokenDelta / TokenResult, got {type(data).__name__}")
        prefix = getattr(data, "talker_prefix", None)
        if fed.prefix is None and prefix is not None:
            fed.prefix = prefix
        reply = getattr(data, "reply", None)
        if isinstance(data, TokenResult):  # the whole answer: every token and row
            fed.tokens = [int(t) for t in data.token_ids]
            fed.total = data.completion_tokens
            fed.text = data.text
            fed.replies = [reply] if reply is not None and reply.numel() else []
            fed.count = int(reply.shape[0]) if reply is not None else 0
            if fed.prefix is None:
                raise ValueError("the thinker finished without sending talker_prefix")
        else:
            fed.tokens.extend(int(t) for t in data.token_ids)
            if reply is not None and reply.numel():
                fed.replies.append(reply)
                fed.count += int(reply.shape[0])

    def ready(self, request_id: str) -> bool:
        fed = self._fed.get(request_id)
        if fed is None or fed.prefix is None:
            return False
        running = self._running.get(request_id)
        needed = 1 if running is None else running.step + 2  # rows 0 (prefill), step + 1 (decode)
        return fed.total is not None or fed.count >= needed

    # --- the runner protocol ---------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        fed = self._fed[request_id]
        prefix = fed.prefix
        if prefix is None:
            raise ValueError("talker prefill before the thinker's talker_prefix arrived")
        if fed.count == 0:
            # The thinker's first token ended the answer: nothing to speak (transformers'
            # generate cannot build a talker prompt then). End at once.
            silent = torch.full((self.config.vocab_size,), float("-inf"))
            silent[min(self.stops)] = 0.0
            return StepOutput(logits=silent, prompt_tokens=0)
        name, speaker = self._speaker(prefix.get("voice"))
        bos = int(speaker["bos_token"])
        rows = prefix["rows"].to(self.device, self.talker.dtype)
        text_bos = self.thinker_embed(torch.tensor([bos], device=self.device))
        embeds = torch.cat([rows, text_bos, self._reply_row(fed, 0)[None]])
        codec = self.talker.get_input_embeddings()(torch.tensor([self.codec_pad, self.codec_bos], device=self.device))
        embeds[-2:] = embeds[-2:] + codec
        length = int(embeds.shape[0])
        prompt_ids = prefix["prompt_ids"].to(self.device)
        text_ids = torch.cat([prompt_ids, torch.tensor([bos, fed.tokens[0]], device=self.device)])[None]
        grid = prefix.get("image_grid_thw")
        audio = prefix.get("audio_feature_lengths")
        mrope, delta = self.talker.get_rope_index(
            text_ids,
            grid.to(self.device) if grid is not None else None,
            None,
            torch.ones(1, length, dtype=torch.long, device=self.device),
            False,
            audio.to(self.device) if audio is not None else None,
            None,
        )
        text = torch.arange(length, device=self.device).view(1, 1, -1)
        cache = DynamicCache()
        logits = self._forward(
            embeds[None], torch.ones(1, length, dtype=torch.long, device=self.device), torch.cat([text, mrope]), cache
        )
        history = [self.codec_mask] * int(prompt_ids.shape[0]) + [self.codec_pad, self.codec_bos]
        self._running[request_id] = _Running(kv_layers(cache), length, int(delta.reshape(-1)[0]), history=history)
        return StepOutput(logits=self._scores(logits[0, -1], history), prompt_tokens=length)

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        ids = tuple(request_ids)
        runs = [self._running[rid] for rid in ids]
        codes = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        text = torch.stack([self._trailing(self._fed[rid], run.step) for rid, run in zip(ids, runs)])
        embeds = (self.talker.get_input_embeddings()(codes) + text)[:, None]
        batch = self._batch_for(ids)
        lengths = torch.tensor([run.length for run in runs], dtype=torch.long, device=self.device)
        deltas = torch.tensor([run.rope_delta for run in runs], dtype=torch.long, device=self.device)
        position_ids = torch.stack([lengths, lengths + deltas, lengths + deltas, lengths + deltas]).view(4, -1, 1)
        logits = self._forward(embeds, batch.next_step_mask(self.device), position_ids, batch.cache)
        outputs = []
        for row, run in enumerate(runs):
            run.history.append(int(codes[row]))
            run.length += 1
            run.step += 1
            outputs.append(StepOutput(logits=self._scores(logits[row, -1], run.history)))
        return outputs

    def _forward(
        self, embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """``Qwen2_5OmniTalkerForConditionalGeneration.forward`` from its input embeddings."""
        out = self.talker.model(
            inputs_embeds=self.talker.thinker_to_talker_proj(embeds),
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
        logits: torch.Tensor = self.talker.codec_head(out.last_hidden_state).float()
        return logits

    def _batch_for(self, request_ids: tuple[str, ...]) -> BatchCache:
        batch = self._batch
        if batch is not None and batch.request_ids == request_ids:
            return batch
        if batch is not None:  # the set changed: take live rows out, then stack the new set
            for row, rid in enumerate(batch.request_ids):
                running = self._running.get(rid)
                if running is not None:
                    running.own_cache = batch.rows(row, copy=rid not in request_ids)
        caches = []
        for rid in request_ids:
            own = self._running[rid].own_cache
            if own is None:
                raise RuntimeError(f"talker: request {rid!r} has no KV rows outside the batch (internal error)")
            caches.append(own)
        self._batch = BatchCache.stack(request_ids, caches)
        for rid in request_ids:
            self._running[rid].own_cache = None
        return self._batch

    def release(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        if self._batch is not None and not any(rid in self._running for rid in self._batch.request_ids):
            self._batch = None  # nobody left in it: free it now
        fed = self._fed.pop(request_id, None)
        if fed is not None and fed.text:
            self._transcripts[request_id] = fed.text

    def forget(self, request_id: str) -> None:
        """Drop everything, the transcript included (abort, failure)."""
        self.release(request_id)
        self._transcripts.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return set(self.stops)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return ""  # codec codes are not text

    def kv_slots(self) -> int:
        return len(self._running)

    def transcript(self, request_id: str) -> str:
        """The thinker's answer text (taken once, with the result)."""
        return self._transcripts.pop(request_id, "")

    def speaker(self, voice: str | None) -> str:
        """The speaker's name in ``spk_dict.pt`` for a request's ``voice`` (None: the default)."""
        return self._speaker(voice)[0]

    # --- internals -------------------------------------------------------------------

    def _speaker(self, voice: str | None) -> tuple[str, dict[str, Any]]:
        key = (voice or DEFAULT_SPEAKER).lower()
        if key not in self.speakers:
            names = sorted(name for name, _ in self.speakers.values())
            raise InvalidRequest(f"voice: {voice!r} is not a speaker of this checkpoint; it has {names}", field="voice")
        return self.speakers[key]

    def _reply_row(self, fed: _Fed, index: int) -> torch.Tensor:
        rows = torch.cat(fed.replies) if len(fed.replies) > 1 else fed.replies[0]
        fed.replies = [rows]
        return rows[index].to(self.device, self.talker.dtype)

    def _trailing(self, fed: _Fed, step: int) -> torch.Tensor:
        """What decode step ``step`` adds: reply row ``step + 1``, then the text end, then pads."""
        if step + 1 < fed.count:
            return self._reply_row(fed, step + 1)
        if fed.total is None:
            raise RuntimeError("talker stepped before the thinker's row was known (internal error)")
        return self.text_eos if step + 1 == fed.count else self.text_pad

    def _scores(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        scores = logits.float().clone()
        if self.repetition_penalty != 1.0 and history:
            seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=scores.device)
            picked = scores[seen]
            scores[seen] = torch.where(picked < 0, picked * self.repetition_penalty, picked / self.repetition_penalty)
        scores[self.codec_bos] = float("-inf")  # generate's suppress_tokens
        return scores
