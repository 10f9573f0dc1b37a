"""The Qwen3-ASR decoder as an autoregressive runner on the project's scheduler.

Batching, per-request KV caches, chunked prefill and sampling come from
:class:`~omnictl.models.hf_causal_lm.HFCausalLMRunner` and the autoregressive scheduler.
This module adapts the decoder to them: the prompt is the token embeddings with the audio
encoder's output scattered in at the audio placeholders, exactly as
``Qwen3ASRModel.forward`` does inside ``generate``; positions are plain (1-D rope).
What the transcript terminal needs to know of the request (the clip's length, a forced
language, whether the answer streams) rides on the request's first output.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import torch

from omnictl.models.hf_causal_lm import HFCausalLMRunner
from omnictl.models.qwen3_asr.weights import load_decoder, load_processor
from omnictl.outputs import TokenDelta, TokenResult
from omnictl.schedulers.autoregressive import AutoregressiveScheduler
from omnictl.schedulers.runner import StepOutput

REQUEST_KEYS = ("duration", "language", "stream")  # passed from preprocessing to the transcript


class AsrDelta(TokenDelta):
    request: Any = None  # {duration, language, stream}, on the request's first output only


class AsrResult(TokenResult):
    request: Any = None  # when nothing was streamed before the result


class DecoderLM(torch.nn.Module):
    """The decoder and LM head of ``Qwen3ASRForConditionalGeneration``, with the call shape
    HFCausalLMRunner uses (it has no audio tower: prompts arrive as embeddings)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.language_model = model.model.language_model
        self.lm_head = model.lm_head
        self.config = model.config.text_config
        self.generation_config = model.generation_config

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = True,
        output_hidden_states: bool = False,
        logits_to_keep: int = 0,
    ) -> SimpleNamespace:
        out = self.language_model(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return SimpleNamespace(logits=self.lm_head(hidden), hidden_states=out.hidden_states)


class DecoderRunner(HFCausalLMRunner):
    """Prefill from ``audio_encoder``'s output (``input_ids`` with placeholders, ``audio_embeds``)."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        model = load_decoder(model_path, device)
        self.audio_token_id = int(model.config.audio_token_id)
        self.embed_tokens = model.model.language_model.get_input_embeddings()
        lm: Any = DecoderLM(model)  # the call shape of a causal LM, not a PreTrainedModel
        super().__init__(lm, load_processor(model_path).tokenizer)
        self._requests: dict[str, dict[str, Any]] = {}

    def prompt_inputs(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        for key in ("input_ids", "audio_embeds"):
            if key not in inputs:
                raise ValueError(f"decoder input lacks {key!r}: it takes audio_encoder's output, got {sorted(inputs)}")
        ids = torch.as_tensor(inputs["input_ids"], dtype=torch.long).reshape(1, -1).to(self.device)
        audio = torch.as_tensor(inputs["audio_embeds"]).to(self.device, self.model.dtype)
        placeholders = ids == self.audio_token_id
        if int(placeholders.sum()) != audio.shape[0]:
            raise ValueError(
                f"decoder input: {int(placeholders.sum())} audio placeholders but {audio.shape[0]} audio embeddings"
            )
        self._check_context(int(ids.shape[1]), "input_ids")
        embeds = self.embed_tokens(ids).masked_scatter(placeholders.unsqueeze(-1), audio)
        return {"inputs_embeds": embeds, "attention_mask": self._ones(ids.shape[1])}

    @torch.inference_mode()
    def prefill(self, request_id: str, inputs: Mapping[str, Any]) -> StepOutput:
        output = super().prefill(request_id, inputs)
        self._requests[request_id] = {key: inputs.get(key) for key in REQUEST_KEYS}
        return output

    def take_request(self, request_id: str) -> dict[str, Any] | None:
        """The request's own facts for the transcript, once (None after the first call)."""
        return self._requests.pop(request_id, None)


class DecoderScheduler(AutoregressiveScheduler):
    """The autoregressive scheduler, attaching the request's facts to its first output."""

    runner: DecoderRunner

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        facts = self.runner.take_request(request_id)
        if facts is None:
            return data
        cls = AsrResult if isinstance(data, TokenResult) else AsrDelta
        fields = {name: getattr(data, name) for name in data.__struct_fields__}
        return cls(**fields, request=facts)

    def on_drop(self, request_id: str) -> None:
        self.runner.take_request(request_id)  # aborted or failed before it was sent
