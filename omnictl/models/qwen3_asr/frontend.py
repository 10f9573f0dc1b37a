"""The front of Qwen3-ASR: the prompt and log-mel features, then the audio encoder.

``Preprocessor`` (the entry stage) turns a request — an :class:`omnictl.inputs.ChatRequest`
(``/v1/audio/transcriptions``, a realtime transcription) or the ``{"messages", ...}`` dict
(the Python API) — into what transformers' ``Qwen3ASRProcessor.apply_transcription_request``
gives for the same audio, language and context: the prompt's token ids (one audio
placeholder per encoder output) and the features. It keeps no raw audio. ``AudioEncoder``
runs the audio tower and the projector: one embedding per placeholder.

What the request may ask and how it maps (refused by name where Qwen3-ASR cannot):

- the spoken clip: the last user message's one audio part;
- ``language`` (an ISO-639-1 code, or a name transformers knows): forced, as the released
  model forces it (the assistant's turn starts ``language NAME<asr_text>``); without one the
  model names the language itself;
- context (the recognition ``prompt``, else a system message's text): the system turn;
- ``temperature`` above 0, ``translate``, word timestamps: refused (the decoder is greedy
  here; Qwen3-ASR transcribes only; its timestamps need the separate forced aligner).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import ChatRequest, as_chat_request, decode_audio
from omnictl.models.qwen3_asr.weights import load_encoder, load_processor

SAMPLE_RATE = 16_000  # the feature extractor's rate
NAME_TO_CODE = {name.lower(): code for code, name in LANGUAGE_CODE_TO_NAME.items()}


def language_name(language: str | None) -> str | None:
    """The name the prompt forces for ``language`` (a code or a name), or None to detect it."""
    if language is None:
        return None
    if language.lower() in LANGUAGE_CODE_TO_NAME:
        return LANGUAGE_CODE_TO_NAME[language.lower()]
    if language.lower() in NAME_TO_CODE:
        return LANGUAGE_CODE_TO_NAME[NAME_TO_CODE[language.lower()]]
    raise InvalidRequest(
        f"language: Qwen3-ASR does not know {language!r}; use one of {', '.join(sorted(LANGUAGE_CODE_TO_NAME))}",
        field="language",
    )


class Preprocessor:
    """Prompt ids and log-mel features for one request, as transformers' processor makes them."""

    def __init__(self, model_path: str | Path | None) -> None:
        self.processor = load_processor(model_path)

    def __call__(self, data: ChatRequest | Mapping[str, Any]) -> dict[str, Any]:
        request = as_chat_request(data)  # audio arrives decoded; only resampled here
        options = request.recognition
        if options is not None:
            if options.task != "transcribe":
                raise InvalidRequest("Qwen3-ASR transcribes only; it does not translate", field="task")
            if options.words:
                raise InvalidRequest(
                    "Qwen3-ASR gives no word timestamps (they need its separate forced aligner, not served here)",
                    field="timestamp_granularities[]",
                )
            if options.temperature not in (None, 0.0):
                raise InvalidRequest(
                    f"Qwen3-ASR decodes greedily here; temperature {options.temperature:g} cannot be applied (send 0)",
                    field="temperature",
                )
        message = request.last_user_message()
        clips = message.audio() if message is not None else []
        if len(clips) != 1:
            raise InvalidRequest(
                f"Qwen3-ASR transcribes one clip: the last user message must hold exactly one audio part, "
                f"it holds {len(clips)}",
                field="messages",
            )
        samples = decode_audio(clips[0], SAMPLE_RATE)
        language = language_name(request.language)
        context = options.prompt if options is not None and options.prompt else None
        if context is None:
            system = [m.text() for m in request.messages if m.role == "system" and m.text()]
            context = "\n".join(system) or None
        # The released prompt, rendered by transformers itself; then the features and the
        # placeholders expanded to the encoder's length, as `tokenize=True` would.
        prompt = self.processor.apply_transcription_request(
            [samples], language=language, prompt=context, tokenize=False
        )[0]
        features = self.processor(text=[prompt], audio=[samples], return_tensors="pt")
        return {
            "input_ids": features["input_ids"][0],
            "input_features": features["input_features"],
            "input_features_mask": features["input_features_mask"],
            # for the transcript: its length, whether the language was forced, how to answer
            "duration": len(samples) / SAMPLE_RATE,
            "language": None if language is None else NAME_TO_CODE[language.lower()],
            "stream": bool(options is not None and options.stream),
        }


class AudioEncoder:
    """Features -> one embedding per audio placeholder (audio tower + projector)."""

    def __init__(self, model_path: str | Path | None, device: str | None = None) -> None:
        self.model = load_encoder(model_path, device)
        self.device = next(self.model.parameters()).device

    @torch.inference_mode()
    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        if "input_features" not in data:
            raise ValueError(f"audio_encoder takes preprocessing's output, got {sorted(data)}")
        output = self.model.get_audio_features(
            data["input_features"].to(self.device), data["input_features_mask"].to(self.device), return_dict=True
        )
        out = {key: value for key, value in data.items() if key not in ("input_features", "input_features_mask")}
        out["audio_embeds"] = output.pooler_output.float().cpu()
        return out
