"""The Qwen2.5-Omni thinker as an autoregressive runner that encodes its own media.

The batching, padding and per-request KV caches come from :class:`HFCausalLMRunner`. The
prompt is the preprocessing stage's output: the audio and vision towers run at prefill,
their output replaces the placeholder embeddings, and the 3-D (mrope) positions come from
``get_rope_index``, as ``Qwen2_5OmniThinkerForConditionalGeneration.generate`` does.

For the talker it keeps what ``Qwen2_5OmniForConditionalGeneration.generate`` reads from
the thinker's hidden states: per prompt position the last layer's state plus the input
embedding (zero at media positions), and per answer token fed back the same sum
(``reply``). A decode step's input is the answer's previous token, so the step that makes
token ``k`` yields the row of token ``k - 1``: the talker gets each row one token later.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from omnictl.exceptions import InvalidRequest
from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.qwen2_5_omni.payloads import ThinkerDelta, ThinkerResult
from omnictl.models.qwen2_5_omni.processor import load_processor
from omnictl.models.qwen2_5_omni.weights import check_model_path, load_thinker
from omnictl.models.qwen3_omni.payloads import extend
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput


class ThinkerLanguageModel(torch.nn.Module):
    """The thinker's text model plus LM head, with the call shape HFCausalLMRunner uses;
    each call also keeps ``last hidden + input embedding`` of its positions (``rows``)."""

    def __init__(self, thinker: Any) -> None:
        super().__init__()
        self.thinker = thinker
        self.config = thinker.config.text_config
        self.generation_config = thinker.generation_config
        self.last: torch.Tensor | None = None  # [batch, length, hidden]: the last layer's states, last call
        self.embeds: torch.Tensor | None = None  # its input embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.thinker.dtype

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = True,
        output_hidden_states: bool = False,
    ) -> SimpleNamespace:
        if inputs_embeds is None:
            inputs_embeds = self.thinker.get_input_embeddings()(input_ids)
        out = self.thinker.model.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=True,
        )
        # transformers' generate hands the talker hidden_states[-1] + hidden_states[0].
        self.last, self.embeds = out.hidden_states[-1], out.hidden_states[0]
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1:])
        return SimpleNamespace(logits=logits, hidden_states=out.hidden_states)


class ThinkerRunner(HFCausalLMRunner):
    """Prefill from the preprocessing stage's output (``input_ids``, audio features, image patches)."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.thinker = load_thinker(model_path, device)
        config = self.thinker.config
        self.audio_token_id = int(config.audio_token_index)
        self.image_token_id = int(config.image_token_index)
        self.language_model = ThinkerLanguageModel(self.thinker)
        tokenizer = load_processor(check_model_path(model_path)).tokenizer
        im_end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        super().__init__(self.language_model, tokenizer, extra_stop_token_ids=[im_end])
        self._rope_delta = 0
        self._pending_prefix: dict[str, Any] = {}  # prompt_inputs -> prefill, same call
        self._prefixes: dict[str, dict[str, Any]] = {}
        self._replies: dict[str, list[torch.Tensor]] = {}
        self._sent: dict[str, int] = {}

    @torch.inference_mode()
    def prompt_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        for key in ("input_ids", "attention_mask"):
            if key not in inputs:
                raise InvalidRequest(
                    f"thinker input lacks {key!r}: it takes the preprocessing stage's output, got {sorted(inputs)}"
                )
        ids = inputs["input_ids"].to(self.device)
        mask = inputs["attention_mask"].to(self.device)
        self._check_context(int(ids.shape[1]), "messages")
        embeds = self.thinker.get_input_embeddings()(ids)
        audio_lengths = None
        if "input_features" in inputs:
            features = inputs["feature_attention_mask"].to(self.device)
            audio = self.thinker.get_audio_features(inputs["input_features"].to(self.device), features)
            audio_mask = (ids == self.audio_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(audio_mask, audio.last_hidden_state.to(embeds.dtype))
            audio_lengths = features.sum(dim=1)
        grid = inputs["image_grid_thw"].to(self.device) if "image_grid_thw" in inputs else None
        if "pixel_values" in inputs:
            image = self.thinker.get_image_features(inputs["pixel_values"].to(self.device), grid)
            image_mask = (ids == self.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(image_mask, torch.cat(image.pooler_output).to(embeds.dtype))
        mrope, delta = self.thinker.get_rope_index(ids, grid, None, mask, False, audio_lengths, None)
        text = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1)
        self._rope_delta = int(delta.reshape(-1)[0])  # read by first_decode_position, same call
        self._pending_prefix = {
            "prompt_ids": ids[0].cpu(),
            "media": ((ids[0] == self.audio_token_id) | (ids[0] == self.image_token_id)).cpu(),
            "embeds": embeds[0],
        }
        if grid is not None:
            self._pending_prefix["image_grid_thw"] = grid.cpu()
        if audio_lengths is not None:
            self._pending_prefix["audio_feature_lengths"] = audio_lengths.cpu()
        return {
            "inputs_embeds": embeds,
            "attention_mask": mask,
            "position_ids": torch.cat([text, mrope.to(text.dtype)], dim=0),
        }

    def first_decode_position(self, model_inputs: Mapping[str, torch.Tensor]) -> int:
        return int(model_inputs["attention_mask"].shape[-1]) + self._rope_delta

    def decode_position_ids(self, request_ids: Sequence[str], sequences: Sequence[Any]) -> torch.Tensor:
        # Row 0 is the text position (the request's own length, for the causal mask); rows 1-3
        # are the mrope positions, shifted by the request's rope delta.
        text = torch.tensor([[s.length] for s in sequences], dtype=torch.long, device=self.device)
        mrope = torch.tensor([[s.next_position] for s in sequences], dtype=torch.long, device=self.device)
        return torch.stack([text, mrope, mrope, mrope])

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        output = super().prefill(request_id, inputs)
        last = self.language_model.last
        if last is None:
            raise RuntimeError("thinker prefill kept no hidden states (internal error)")
        pending = self._pending_prefix
        # transformers zeroes the input embedding at media positions (the hidden state stays).
        embeds = pending.pop("embeds").clone()
        embeds[pending["media"].to(embeds.device)] = 0
        prefix = {**pending, "rows": (last[0] + embeds).float().cpu()}
        if "voice" in inputs:
            prefix["voice"] = inputs["voice"]
        self._prefixes[request_id] = prefix
        self._replies[request_id] = []
        return output

    @torch.inference_mode()
    def decode(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> list[StepOutput]:
        outputs = super().decode(request_ids, token_ids)
        last, embeds = self.language_model.last, self.language_model.embeds
        if last is None or embeds is None:
            raise RuntimeError("thinker decode kept no hidden states (internal error)")
        rows = (last[:, -1] + embeds[:, -1]).float().cpu()
        for row, rid in enumerate(request_ids):
            self._replies[rid].append(rows[row])
        return outputs

    def take_for_talker(self, request_id: str, *, final: bool) -> dict[str, Any]:
        """The talker's inputs not sent yet (all the reply rows when ``final``); forgets the
        request after the final one."""
        replies = self._replies.get(request_id, [])
        start = 0 if final else self._sent.get(request_id, 0)
        taken = replies[start:]
        extra: dict[str, Any] = {}
        prefix = self._prefixes.pop(request_id, None)
        if prefix is not None:
            extra["talker_prefix"] = prefix
        if taken or final:
            width = self.thinker.config.text_config.hidden_size
            extra["reply"] = torch.stack(taken) if taken else torch.zeros(0, width)
        if final:
            self.forget(request_id)
        else:
            self._sent[request_id] = len(replies)
        return extra

    def forget(self, request_id: str) -> None:
        self._prefixes.pop(request_id, None)
        self._replies.pop(request_id, None)
        self._sent.pop(request_id, None)


class ThinkerScheduler(AutoregressiveScheduler):
    """The autoregressive scheduler, attaching the talker's inputs to every output."""

    runner: ThinkerRunner

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        return extend(data, ThinkerDelta, ThinkerResult, **self.runner.take_for_talker(request_id, final=final))

    def on_drop(self, request_id: str) -> None:
        self.runner.forget(request_id)  # aborted or failed before its result
