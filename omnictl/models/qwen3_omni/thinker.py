"""The Qwen3-Omni thinker as an autoregressive runner, starting from input embeddings.

The batching, padding and per-request KV caches come from :class:`HFCausalLMRunner`;
this module adapts the thinker's text model to it (3-D mrope positions, deepstack
image features on the first layers) and hands the talker what it needs once per
request: the prompt's token ids and the thinker's hidden states at the talker's
``accept_hidden_layer`` for the multimodal positions (``talker_prefix``, attached to
the request's first stream chunk, or to its result when nothing was streamed).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.qwen3_omni.payloads import ThinkerDelta, ThinkerResult, extend
from omnictl.models.qwen3_omni.processor import load_processor
from omnictl.models.qwen3_omni.weights import check_model_path, load_config, load_thinker
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput


class ThinkerLanguageModel(torch.nn.Module):
    """The thinker's text model plus LM head, with the call shape HFCausalLMRunner uses.

    A prefill (more than one input position) also keeps the prompt's hidden states at
    ``keep_layer`` in ``last_prompt_hidden``: the talker reads them.
    """

    def __init__(self, thinker: Any, keep_layer: int) -> None:
        super().__init__()
        self.thinker = thinker
        self.config = thinker.config.text_config
        self.generation_config = thinker.generation_config
        self.keep_layer = keep_layer
        self.last_prompt_hidden: torch.Tensor | None = None

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
        deepstack_visual_embeds: list[torch.Tensor] | None = None,
        visual_pos_masks: torch.Tensor | None = None,
    ) -> SimpleNamespace:
        length = (inputs_embeds if inputs_embeds is not None else input_ids).shape[1]
        is_prefill = length > 1
        out = self.thinker.model.language_model(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states or is_prefill,
            deepstack_visual_embeds=deepstack_visual_embeds,
            visual_pos_masks=visual_pos_masks,
        )
        if is_prefill:
            self.last_prompt_hidden = out.hidden_states[self.keep_layer][0]
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1:])
        return SimpleNamespace(logits=logits, hidden_states=out.hidden_states)


class ThinkerRunner(HFCausalLMRunner):
    """Prefill from ``mm_aggregate``'s output (``inputs_embeds``, ``position_ids``, ...)."""

    # In a tensor-parallel group every rank keeps a talker prefix per prefill: taking it
    # runs on every rank too, or the followers would keep them all.
    tensor_parallel_ops = ("take_talker_prefix",)

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        config = load_config(model_path)
        self.mm_token_ids = torch.tensor(
            [
                config.thinker_config.audio_token_id,
                config.thinker_config.image_token_id,
                config.thinker_config.video_token_id,
            ]
        )
        self.language_model = ThinkerLanguageModel(
            load_thinker(model_path, device), config.talker_config.accept_hidden_layer
        )
        tokenizer = load_processor(check_model_path(model_path)).tokenizer
        super().__init__(self.language_model, tokenizer, extra_stop_token_ids=[config.im_end_token_id])
        self._rope_delta = 0
        self._talker_prefixes: dict[str, dict[str, Any]] = {}

    def prompt_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        for key in ("inputs_embeds", "position_ids", "rope_delta", "prompt_ids"):
            if key not in inputs:
                raise ValueError(f"thinker input lacks {key!r}: it takes mm_aggregate's output, got {sorted(inputs)}")
        embeds = inputs["inputs_embeds"].to(self.device, self.model.dtype)[None]
        model_inputs: dict[str, Any] = {
            "inputs_embeds": embeds,
            "attention_mask": self._ones(embeds.shape[1]),
            "position_ids": inputs["position_ids"].to(self.device),
        }
        if "deepstack" in inputs:
            model_inputs["deepstack_visual_embeds"] = list(inputs["deepstack"].to(self.device, self.model.dtype))
            model_inputs["visual_pos_masks"] = inputs["visual_pos_masks"].to(self.device)
        self._rope_delta = int(inputs["rope_delta"])  # read by first_decode_position, same call
        return model_inputs

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
        prompt_ids = inputs["prompt_ids"].reshape(-1).cpu()
        hidden = self.language_model.last_prompt_hidden
        if hidden is None:
            raise RuntimeError("thinker prefill kept no prompt hidden states (internal error)")
        multimodal = torch.isin(prompt_ids, self.mm_token_ids)
        prefix: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "mm_hidden": hidden[multimodal.to(hidden.device)].float().cpu(),
        }
        for key in ("image_grid_thw", "audio_feature_lengths", "voice"):
            if key in inputs:
                prefix[key] = inputs[key]
        self._talker_prefixes[request_id] = prefix
        return output

    def take_talker_prefix(self, request_id: str) -> dict[str, Any] | None:
        """The talker's per-request inputs, once (None after the first call)."""
        return self._talker_prefixes.pop(request_id, None)


class ThinkerScheduler(AutoregressiveScheduler):
    """The autoregressive scheduler, attaching ``talker_prefix`` to a request's first output."""

    runner: ThinkerRunner

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        prefix = self.runner.take_talker_prefix(request_id)
        return data if prefix is None else extend(data, ThinkerDelta, ThinkerResult, talker_prefix=prefix)

    def on_drop(self, request_id: str) -> None:
        self.runner.take_talker_prefix(request_id)  # aborted or failed before it was sent
