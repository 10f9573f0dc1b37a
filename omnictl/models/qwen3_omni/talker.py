"""The Qwen3-Omni talker as an autoregressive runner fed by the thinker's stream.

It reproduces ``Qwen3OmniMoeForConditionalGeneration.generate``'s talker half one step
at a time. The talker's prompt is the user turns (text projected from the thinker's
input embeddings, media from the thinker's hidden states) plus the assistant header
and the thinker's first token; decode step ``j`` adds the thinker's token ``j + 1``
(``tts_eos`` after the last, ``tts_pad`` beyond). So a step only waits until the
thinker has produced that token, not for the whole answer: the talker speaks while
the thinker thinks. Each step also runs the code predictor, which fills in the
residual code groups of the previous frame; finished frames ride along with the
stream chunks (``codes``, ``[n, num_code_groups]``) to ``code2wav``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from omnictl.models.qwen3_omni.talker_prompt import TalkerPrompt, build_talker_prompt
from omnictl.models.qwen3_omni.weights import load_model
from omnictl.schedulers.runner import StepOutput


@dataclass(slots=True)
class _Fed:
    """What the thinker has sent for one request so far."""

    prefix: dict[str, Any] | None = None
    tokens: list[int] = field(default_factory=list)  # generated text tokens, without a stop token
    total: int | None = None  # the thinker's completion_tokens, once it finished
    text: str = ""


@dataclass(slots=True)
class _Running:
    prompt: TalkerPrompt
    cache: DynamicCache
    past_hidden: torch.Tensor  # last layer, last position: the code predictor's first input
    length: int  # cached positions
    step: int = 0  # decode steps done (transformers' `generation_step`)
    history: list[int] = field(default_factory=list)  # generated layer-0 codes (repetition penalty)


class TalkerRunner:
    """Implements the autoregressive runner protocol plus ``feed`` / ``ready``."""

    def __init__(
        self, model_path: str | Path | None, device: str | None = None, *, repetition_penalty: float = 1.05
    ) -> None:
        full = load_model(model_path, device)
        self.config = full.config
        self.talker = full.talker
        self.thinker_embed = full.thinker.get_input_embeddings()
        self.device = self.talker.device
        self.repetition_penalty = repetition_penalty
        talker_config = self.config.talker_config
        self.num_code_groups = talker_config.num_code_groups
        self.eos = talker_config.codec_eos_token_id
        vocab = talker_config.text_config.vocab_size
        # transformers suppresses the top 1024 ids (codec specials) except end-of-speech.
        self.suppressed = torch.tensor([i for i in range(max(vocab - 1024, 0), vocab) if i != self.eos], dtype=torch.long)
        self._fed: dict[str, _Fed] = {}
        self._running: dict[str, _Running] = {}
        self._frames: dict[str, list[torch.Tensor]] = {}
        self._sent_frames: dict[str, int] = {}
        self._sample_codes: dict[str, bool] = {}
        self._transcripts: dict[str, str] = {}

    # --- stream input ----------------------------------------------------------------

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        fed = self._fed.setdefault(request_id, _Fed())
        if not isinstance(data, Mapping):
            return
        if fed.prefix is None and "talker_prefix" in data:
            fed.prefix = data["talker_prefix"]
        if "finish_reason" in data:  # the thinker's final result: the whole answer
            fed.tokens = [int(t) for t in data["token_ids"]]
            fed.total = int(data["completion_tokens"])
            fed.text = str(data.get("text", ""))
            if fed.prefix is None:
                raise ValueError("the thinker finished without sending talker_prefix")
        elif "token_ids" in data:
            fed.tokens.extend(int(t) for t in data["token_ids"])

    def ready(self, request_id: str) -> bool:
        fed = self._fed.get(request_id)
        if fed is None or fed.prefix is None:
            return False
        running = self._running.get(request_id)
        needed = 2 if running is None else running.step + 3  # see `_thinker_text`
        return fed.total is not None or len(fed.tokens) >= needed

    def set_code_sampling(self, request_id: str, sample: bool) -> None:
        self._sample_codes[request_id] = sample

    # --- the runner protocol ---------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        fed = self._fed[request_id]
        if fed.prefix is None:
            raise ValueError("talker prefill before the thinker's talker_prefix arrived")
        first = self._thinker_text(fed, 0)
        prompt = build_talker_prompt(self.config, self.talker, self.thinker_embed, fed.prefix, first)
        cache = DynamicCache()
        out = self.talker(
            inputs_embeds=prompt.embeds,
            attention_mask=torch.ones(1, prompt.length, dtype=torch.long, device=self.device),
            position_ids=prompt.position_ids,
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        self._running[request_id] = _Running(prompt, cache, out.hidden_states[0][-1][:, -1:], prompt.length)
        self._frames.setdefault(request_id, [])
        return StepOutput(logits=self._scores(out.logits[0, -1], []), prompt_tokens=prompt.length)

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        return [self._decode_one(rid, int(token)) for rid, token in zip(request_ids, token_ids)]

    def _decode_one(self, request_id: str, token: int) -> StepOutput:
        running = self._running[request_id]
        last_code = torch.tensor([[token]], dtype=torch.long, device=self.device)
        last_hidden = self.talker.get_input_embeddings()(last_code)
        sample = self._sample_codes.get(request_id, False)
        extra = {"top_k": 50, "top_p": 0.8} if sample else {}
        predicted = self.talker.code_predictor.generate(
            inputs_embeds=torch.cat((running.past_hidden, last_hidden), dim=1),
            max_new_tokens=self.num_code_groups - 1,
            do_sample=sample,
            output_hidden_states=True,
            return_dict_in_generate=True,
            **extra,
        )
        self._frames[request_id].append(torch.cat((last_code, predicted.sequences), dim=-1)[0].cpu())
        residual_hidden = [hidden[0] for hidden in predicted.hidden_states[1:]]
        last_residual = self.talker.code_predictor.get_input_embeddings()[-1](predicted.sequences[..., -1:])
        embeds = torch.cat([last_hidden, *residual_hidden, last_residual], dim=1).sum(1, keepdim=True)
        embeds = embeds + running.prompt.text_step(self._trailing(self._fed[request_id], running.step))
        delta = running.prompt.rope_delta
        position_ids = torch.tensor(
            [running.length, running.length + delta, running.length + delta, running.length + delta],
            dtype=torch.long,
            device=self.device,
        ).view(4, 1, 1)
        out = self.talker(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, running.length + 1, dtype=torch.long, device=self.device),
            position_ids=position_ids,
            cache=running.cache,
            use_cache=True,
            output_hidden_states=True,
            generation_step=running.step,  # only echoed back (+1) by transformers
        )
        running.history.append(token)
        running.past_hidden = out.hidden_states[0][-1][:, -1:]
        running.length += 1
        running.step += 1
        return StepOutput(logits=self._scores(out.logits[0, -1], running.history))

    def release(self, request_id: str) -> None:
        # Frames stay until the scheduler took them (the result is sent after release).
        self._running.pop(request_id, None)
        fed = self._fed.pop(request_id, None)
        if fed is not None and fed.text:
            self._transcripts[request_id] = fed.text
        self._sample_codes.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """Drop everything, frames included (abort, failure)."""
        self.release(request_id)
        self._frames.pop(request_id, None)
        self._sent_frames.pop(request_id, None)
        self._transcripts.pop(request_id, None)

    def stop_token_ids(self) -> set[int]:
        return {self.eos}

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return ""  # codec codes are not text

    def kv_slots(self) -> int:
        return len(self._running)

    # --- frames for code2wav ---------------------------------------------------------

    def take_frames(self, request_id: str, *, final: bool) -> torch.Tensor:
        """Frames finished since the last call (all of them and forget, when ``final``)."""
        frames = self._frames.get(request_id, [])
        start = 0 if final else self._sent_frames.get(request_id, 0)
        taken = frames[start:]
        if final:
            self._frames.pop(request_id, None)
            self._sent_frames.pop(request_id, None)
        else:
            self._sent_frames[request_id] = len(frames)
        if not taken:
            return torch.zeros(0, self.num_code_groups, dtype=torch.long)
        return torch.stack(taken)

    def transcript(self, request_id: str) -> str:
        """The thinker's answer text (taken once, with the result)."""
        return self._transcripts.pop(request_id, "")

    # --- internals -------------------------------------------------------------------

    def _thinker_text(self, fed: _Fed, index: int) -> int | None:
        """Thinker token ``index`` if it is spoken, None when the answer ended before it.

        transformers feeds the talker the thinker's generated tokens except the last one
        (the stop token, or the token cut by max_tokens): it only has input embeddings for
        those. So token ``index`` is spoken iff the thinker generated more than ``index + 1``.
        """
        if fed.total is not None:
            return fed.tokens[index] if index < fed.total - 1 else None
        if index + 1 < len(fed.tokens):
            return fed.tokens[index]
        raise RuntimeError("talker stepped before the thinker's token was known (internal error)")

    def _trailing(self, fed: _Fed, step: int) -> int | str:
        """What decode step ``step`` adds: thinker token ``step + 1``, then "eos", then "pad"."""
        if fed.total is None or step + 1 < fed.total - 1:
            token = self._thinker_text(fed, step + 1)
            if token is None:
                raise RuntimeError("talker: thinker token missing (internal error)")
            return token
        return "eos" if step == max(fed.total - 2, 0) else "pad"

    def _scores(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        scores = logits.float().clone()
        if self.repetition_penalty != 1.0 and history:
            seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=scores.device)
            picked = scores[seen]
            scores[seen] = torch.where(picked < 0, picked * self.repetition_penalty, picked / self.repetition_penalty)
        scores[self.suppressed.to(scores.device)] = float("-inf")
        return scores
