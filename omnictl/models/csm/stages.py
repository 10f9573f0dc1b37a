"""Stage factories for CSM (``topologies/csm.yaml``): preprocessing, backbone, depth decoder.

The audio terminal is Mimi's decoder, shared with every family that speaks through
Mimi (:func:`omnictl.models.mimi.stages.decoder`).

What the entry stage takes, and what CSM is asked to say:

- a speech request (``/v1/audio/speech``): its ``input``, spoken by speaker ``voice`` (a
  speaker id such as ``"0"``; OpenAI's voice names, or none, are speaker 0);
- a chat request (chat completions, audio out): CSM speaks text, it does not answer it,
  so the last message's text is what it says, in the voice's speaker; the messages before
  it are the conversation it speaks in (each its own turn, the user's as speaker 1 when
  the voice is speaker 0, else as speaker 0; the assistant's as the voice's). Text only:
  audio context goes through the Mimi encoder, not wired here yet, and is refused by name;
- from Python: ``{"text": ..., "voice": "0"}`` or ``{"messages": [...]}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import ChatRequest, SpeechRequest, as_chat_request
from omnictl.models.csm.backbone import DEFAULT_SAMPLING, BackboneRunner, BackboneScheduler
from omnictl.models.csm.depth import DepthDecoder, DepthScheduler, default_sampling
from omnictl.serving.chat.protocol import OPENAI_VOICES


def _speaker(voice: Any) -> str:
    if voice is None or voice in OPENAI_VOICES:
        return "0"
    if isinstance(voice, str) and voice.isdigit():
        return str(int(voice))
    raise InvalidRequest(f"'voice': CSM's voices are speaker ids such as '0' or '1', got {voice!r}", field="voice")


def conversation(inputs: Any) -> list[dict[str, Any]]:
    """CSM's conversation (its processor's chat-template input) for a request; InvalidRequest names the field."""
    if isinstance(inputs, Mapping) and "text" in inputs and "messages" not in inputs:
        text, voice = inputs["text"], inputs.get("voice")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("'text' must be non-empty text to speak", field="text")
        return [{"role": _speaker(voice), "content": [{"type": "text", "text": text}]}]
    if isinstance(inputs, SpeechRequest):
        if inputs.speed != 1.0:
            raise InvalidRequest("'speed': CSM speaks at its own pace; only 1.0 is served", field="speed")
        return [{"role": _speaker(inputs.voice), "content": [{"type": "text", "text": inputs.text}]}]
    chat = inputs if isinstance(inputs, ChatRequest) else as_chat_request(inputs)
    speaker = _speaker(chat.voice)
    other = "1" if speaker == "0" else "0"
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(chat.messages):
        if message.audio():
            raise InvalidRequest(
                f"'messages[{i}]': CSM here takes text only (audio context is not wired yet)", field=f"messages[{i}]"
            )
        if message.role == "system" or not message.text().strip():
            continue  # CSM has no system turn; an empty turn says nothing
        role = other if message.role == "user" else speaker
        turns.append({"role": role, "content": [{"type": "text", "text": message.text()}]})
    if not turns:
        raise InvalidRequest("'messages': no text for CSM to speak", field="messages")
    turns[-1]["role"] = speaker  # the last message is what the voice says
    return turns


class Preprocessor:
    """The entry stage: a request to the prompt's token ids (CSM's processor and template)."""

    def __init__(self, model_path: str | Path | None) -> None:
        from transformers import AutoProcessor

        if model_path is None:
            raise ValueError("factory_args.model_path: CSM needs a local checkpoint (serve --model PATH)")
        self.processor = AutoProcessor.from_pretrained(str(model_path))

    def __call__(self, inputs: Any) -> dict[str, Any]:
        turns = conversation(inputs)
        prompt = self.processor.apply_chat_template(turns, tokenize=True, return_dict=True)
        return {"input_ids": prompt["input_ids"].reshape(1, -1)}


def preprocessing(model_path: str | Path | None = None) -> Callable[[Any], dict[str, Any]]:
    return Preprocessor(model_path)


def backbone(
    model_path: str | Path | None = None,
    device: str | None = None,
    max_frames: int = DEFAULT_SAMPLING["max_tokens"],
    temperature: float = DEFAULT_SAMPLING["temperature"],
    top_k: int = DEFAULT_SAMPLING["top_k"],
    max_batch: int = 32,
) -> BackboneScheduler:
    """``max_frames``: a request's frames when it does not say (``max_tokens``; 80 ms each)."""
    sampling = {"max_tokens": max_frames, "temperature": temperature, "top_k": top_k}
    return BackboneScheduler(BackboneRunner(model_path, device), max_batch=max_batch, sampling=sampling)


def depth_decoder(
    model_path: str | Path | None = None,
    device: str | None = None,
    backbone: str = "backbone",
    temperature: float = DEFAULT_SAMPLING["temperature"],
    top_k: int = DEFAULT_SAMPLING["top_k"],
) -> DepthScheduler:
    """``backbone``: the name of the backbone stage (in this stage's process) that reads each frame back."""
    sampling = {**default_sampling(), "temperature": temperature, "top_k": top_k}
    return DepthScheduler(DepthDecoder(model_path, device), backbone=backbone, sampling=sampling)
