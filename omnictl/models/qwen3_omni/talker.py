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

from omnictl.models.kv_batch import KV, BatchCache, kv_layers
from omnictl.models.qwen3_omni.talker_prompt import TalkerPrompt, build_talker_prompt
from omnictl.models.qwen3_omni.weights import load_talker
from omnictl.outputs import TokenDelta, TokenResult
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
    own_cache: KV | None  # None while the batch cache holds this request's rows
    past_hidden: torch.Tensor  # last layer, last position: the code predictor's first input
    length: int  # cached positions
    step: int = 0  # decode steps done (transformers' `generation_step`)
    history: list[int] = field(default_factory=list)  # generated layer-0 codes (repetition penalty)


class TalkerRunner:
    """Implements the autoregressive runner protocol plus ``feed`` / ``ready``."""

    def __init__(
        self, model_path: str | Path | None, device: str | None = None, *, repetition_penalty: float = 1.05
    ) -> None:
        parts = load_talker(model_path, device)
        self.config = parts.config
        self.talker = parts.talker
        self.thinker_embed = parts.thinker_embed
        self.device = self.talker.device
        self.repetition_penalty = repetition_penalty
        talker_config = self.config.talker_config
        self.num_code_groups = talker_config.num_code_groups
        self.eos = talker_config.codec_eos_token_id
        vocab = talker_config.text_config.vocab_size
        # transformers suppresses the top 1024 ids (codec specials) except end-of-speech.
        self.suppressed = torch.tensor(
            [i for i in range(max(vocab - 1024, 0), vocab) if i != self.eos], dtype=torch.long
        )
        self._fed: dict[str, _Fed] = {}
        self._running: dict[str, _Running] = {}
        self._frames: dict[str, list[torch.Tensor]] = {}
        self._sent_frames: dict[str, int] = {}
        self._sample_codes: dict[str, bool] = {}
        self._transcripts: dict[str, str] = {}
        self._batch: BatchCache | None = None

    # --- stream input ----------------------------------------------------------------

    def feed(self, request_id: str, data: Any, *, done: bool) -> None:
        fed = self._fed.setdefault(request_id, _Fed())
        if data is None:
            return  # the thinker's stream ended; its result is still to come
        if not isinstance(data, (TokenDelta, TokenResult)):
            # a wrong upstream must fail the request, not leave it waiting for a prefix forever
            raise TypeError(f"the talker reads the thinker's TokenDelta / TokenResult, got {type(data).__name__}")
        prefix = getattr(data, "talker_prefix", None)  # on the thinker's first output only
        if fed.prefix is None and prefix is not None:
            fed.prefix = prefix
        if isinstance(data, TokenResult):  # the thinker's final result: the whole answer
            fed.tokens = [int(t) for t in data.token_ids]
            fed.total = data.completion_tokens
            fed.text = data.text
            if fed.prefix is None:
                raise ValueError("the thinker finished without sending talker_prefix")
        else:
            fed.tokens.extend(int(t) for t in data.token_ids)

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
        self._frames.setdefault(request_id, [])
        if first is None:
            # The thinker said nothing (it stopped at once): nothing to speak, end right away.
            # (transformers' generate cannot build a talker prompt in this case.)
            silent = torch.full((self.config.talker_config.text_config.vocab_size,), float("-inf"))
            silent[self.eos] = 0.0
            return StepOutput(logits=silent, prompt_tokens=0)
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
        self._running[request_id] = _Running(prompt, kv_layers(cache), out.hidden_states[0][-1][:, -1:], prompt.length)
        return StepOutput(logits=self._scores(out.logits[0, -1], []), prompt_tokens=prompt.length)

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        ids = tuple(request_ids)
        runs = [self._running[rid] for rid in ids]
        codes = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)[:, None]
        last_hidden = self.talker.get_input_embeddings()(codes)  # [batch, 1, hidden]
        past_hidden = torch.cat([run.past_hidden for run in runs])
        residual_codes, residual_embeds = self._residuals(ids, past_hidden, last_hidden)
        embeds = torch.cat([last_hidden, residual_embeds], dim=1).sum(1, keepdim=True)
        text = [run.prompt.text_step(self._trailing(self._fed[rid], run.step)) for rid, run in zip(ids, runs)]
        embeds = embeds + torch.cat(text)
        batch = self._batch_for(ids)
        lengths = torch.tensor([run.length for run in runs], dtype=torch.long, device=self.device)
        deltas = torch.tensor([run.prompt.rope_delta for run in runs], dtype=torch.long, device=self.device)
        position_ids = torch.stack([lengths, lengths + deltas, lengths + deltas, lengths + deltas]).view(4, -1, 1)
        out = self.talker(
            inputs_embeds=embeds,
            attention_mask=batch.next_step_mask(self.device),
            position_ids=position_ids,
            cache=batch.cache,
            use_cache=True,
            output_hidden_states=True,
            generation_step=0,  # only echoed back (+1) by transformers
        )
        outputs = []
        for row, (rid, run) in enumerate(zip(ids, runs)):
            self._frames[rid].append(torch.cat((codes[row], residual_codes[row])).cpu())
            run.history.append(int(codes[row, 0]))
            run.past_hidden = out.hidden_states[0][-1][row : row + 1, -1:]
            run.length += 1
            run.step += 1
            outputs.append(StepOutput(logits=self._scores(out.logits[row, -1], run.history)))
        return outputs

    def _residuals(
        self, ids: tuple[str, ...], past_hidden: torch.Tensor, last_hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The code predictor's residual codes ``[batch, groups - 1]`` and their embeddings.

        Greedy rows run a plain loop (what ``generate`` does, minus its overhead); sampling rows ``generate``.
        """
        groups = self.num_code_groups - 1
        codes = torch.empty(len(ids), groups, dtype=torch.long, device=self.device)
        embeds = last_hidden.new_empty(len(ids), groups, last_hidden.shape[-1])
        for sample in (False, True):
            rows = [row for row, rid in enumerate(ids) if self._sample_codes.get(rid, False) is sample]
            if not rows:
                continue
            index = torch.tensor(rows, device=self.device)
            first_inputs = torch.cat((past_hidden[index], last_hidden[index]), dim=1)
            found = self._predict_greedy(first_inputs) if not sample else self._predict_sampled(first_inputs)
            codes[index] = found
            tables = self.talker.code_predictor.get_input_embeddings()
            embeds[index] = torch.cat([tables[group](found[:, group : group + 1]) for group in range(groups)], dim=1)
        return codes, embeds

    def _predict_greedy(self, first_inputs: torch.Tensor) -> torch.Tensor:
        """Greedy residual codes: the loop ``generate`` runs, without its per-call overhead."""
        predictor = self.talker.code_predictor
        cache = DynamicCache()
        out = predictor(inputs_embeds=first_inputs, cache=cache, use_cache=True)
        found = [out.logits[:, -1].argmax(-1)]
        for group in range(1, self.num_code_groups - 1):
            out = predictor(input_ids=found[-1][:, None], cache=cache, use_cache=True, generation_steps=group)
            found.append(out.logits[:, -1].argmax(-1))
        return torch.stack(found, dim=1)

    def _predict_sampled(self, first_inputs: torch.Tensor) -> torch.Tensor:
        predicted = self.talker.code_predictor.generate(
            inputs_embeds=first_inputs,
            max_new_tokens=self.num_code_groups - 1,
            do_sample=True,
            top_k=50,
            top_p=0.8,  # transformers' settings for the code predictor when the talker samples
        )
        return predicted[:, -(self.num_code_groups - 1) :]

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
        # Frames stay until the scheduler took them (the result is sent after release).
        self._running.pop(request_id, None)
        if self._batch is not None and not any(rid in self._running for rid in self._batch.request_ids):
            self._batch = None  # nobody left in it: free it now
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
