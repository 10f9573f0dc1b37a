"""Stage factories for Higgs Audio v2 (``topologies/higgs-audio.yaml``): preprocessing, generator, audio decoder.

What the entry stage takes, and what Higgs Audio is asked to say:

- a speech request (``/v1/audio/speech``): its ``input``, in the model's own voice (no
  reference audio: OpenAI's voice names, or none; any other voice is refused by name);
- a chat request (chat completions, audio out): the messages as Higgs Audio's turns
  (system, user, assistant; text only), then the assistant's audio: a TTS model, it
  speaks the last user message. Without a system message it gets Boson AI's
  ("Generate audio following instruction."). Audio parts (voice cloning from a
  reference clip) need the audio tokenizer's encoder, whose resampler this install
  lacks (see :mod:`omnictl.models.higgs_audio.codec`): refused by name;
- from Python: ``{"text": ..., "voice": ...}`` or ``{"messages": [...]}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import ChatRequest, SpeechRequest, as_chat_request
from omnictl.models.higgs_audio.codec import AudioTokenizer, audio_tokenizer_path
from omnictl.models.higgs_audio.generator import DEFAULT_SAMPLING, GeneratorRunner, GeneratorScheduler
from omnictl.models.higgs_audio.tiny import SYSTEM_PROMPT
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.schedulers.streaming import FinishOn, StreamingScheduler, Window
from omnictl.serving.chat.protocol import OPENAI_VOICES


def _voice(voice: Any) -> None:
    if voice is None or voice in OPENAI_VOICES:
        return
    raise InvalidRequest(
        f"'voice': Higgs Audio speaks in its own voice here (OpenAI's voice names, or none), got {voice!r}; "
        "a cloned voice needs reference audio, which is not wired yet",
        field="voice",
    )


def _turn(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def conversation(inputs: Any) -> list[dict[str, Any]]:
    """Higgs Audio's conversation (its chat template's input) for a request; InvalidRequest names the field."""
    if isinstance(inputs, Mapping) and "text" in inputs and "messages" not in inputs:
        text = inputs["text"]
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("'text' must be non-empty text to speak", field="text")
        _voice(inputs.get("voice"))
        return [_turn("system", SYSTEM_PROMPT), _turn("user", text)]
    if isinstance(inputs, SpeechRequest):
        if inputs.speed != 1.0:
            raise InvalidRequest("'speed': Higgs Audio speaks at its own pace; only 1.0 is served", field="speed")
        _voice(inputs.voice)
        return [_turn("system", SYSTEM_PROMPT), _turn("user", inputs.text)]
    chat = inputs if isinstance(inputs, ChatRequest) else as_chat_request(inputs)
    _voice(chat.voice)
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(chat.messages):
        if message.audio():
            raise InvalidRequest(
                f"'messages[{i}]': Higgs Audio here takes text only (reference audio is not wired yet)",
                field=f"messages[{i}]",
            )
        if message.role not in ("system", "user", "assistant"):
            raise InvalidRequest(
                f"'messages[{i}].role': Higgs Audio's turns are system, user and assistant, got {message.role!r}",
                field=f"messages[{i}].role",
            )
        if message.text().strip():
            turns.append(_turn(message.role, message.text()))
    if not any(turn["role"] == "user" for turn in turns):
        raise InvalidRequest("'messages': no user text for Higgs Audio to speak", field="messages")
    if turns[0]["role"] != "system":
        turns.insert(0, _turn("system", SYSTEM_PROMPT))
    return turns


class Preprocessor:
    """The entry stage: a request to the prompt's token ids (the checkpoint's tokenizer and chat template).

    The tokenizer alone: ``HiggsAudioV2Processor`` would also load the audio tokenizer,
    which only its audio parts (refused here) use; the prompt is the same (a test says so)."""

    def __init__(self, model_path: str | Path | None) -> None:
        from transformers import AutoTokenizer

        if model_path is None:
            raise ValueError("factory_args.model_path: Higgs Audio needs a local checkpoint (serve --model PATH)")
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        # Text that spells a special token would become that token (an audio placeholder
        # with no audio behind it): refused by name.
        self._special = sorted(t for t in self.tokenizer.all_special_tokens if t.startswith("<|"))
        self._special += [t for t in self.tokenizer.get_added_vocab() if t.startswith("<|") and t not in self._special]

    def __call__(self, inputs: Any) -> dict[str, Any]:
        turns = conversation(inputs)
        for turn in turns:
            text = turn["content"][0]["text"]
            spelled = next((token for token in self._special if token in text), None)
            if spelled is not None:
                raise InvalidRequest(f"the text spells the special token {spelled!r}; remove it", field="input")
        prompt: Any = self.tokenizer.apply_chat_template(  # Any: typed as every form it can return
            turns, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        return {"input_ids": prompt["input_ids"].reshape(1, -1)}


def preprocessing(model_path: str | Path | None = None) -> Callable[[Any], dict[str, Any]]:
    return Preprocessor(model_path)


def generator(
    model_path: str | Path | None = None,
    device: str | None = None,
    max_frames: int = DEFAULT_SAMPLING["max_tokens"],
    temperature: float = DEFAULT_SAMPLING["temperature"],
    top_p: float = DEFAULT_SAMPLING["top_p"],
    top_k: int = DEFAULT_SAMPLING["top_k"],
    max_batch: int = 32,
) -> GeneratorScheduler:
    """``max_frames``: a request's frames when it does not say (``max_tokens``; 40 ms each)."""
    sampling = {"max_tokens": max_frames, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    return GeneratorScheduler(GeneratorRunner(model_path, device), max_batch=max_batch, sampling=sampling)


def _codes(data: Any) -> torch.Tensor:
    """The codec frames of the generator's chunk or result."""
    codes = data["codes"] if isinstance(data, Mapping) else data.codes
    tensor = torch.as_tensor(codes, dtype=torch.long)
    return tensor.reshape(-1, tensor.shape[-1])


def audio_decoder(
    model_path: str | Path | None = None,
    device: str | None = None,
    audio_tokenizer: str | Path | None = None,
    chunk_frames: int = 4,
    left_context: int = 8,
    lookahead: int = 4,
) -> StreamingScheduler:
    """The audio tokenizer's decoder as a streaming audio terminal.

    The DAC decoder looks both ways, so a frame's samples are final only once the frames
    after it are known: every ``chunk_frames`` new frames are decoded with up to
    ``left_context`` earlier frames in front, and the samples go out up to ``lookahead``
    frames before the newest (those follow with the next window, or at the end). With 4
    frames each way the samples are within 2e-7 of one decode of the whole sequence
    (tests/models/higgs_audio). ``audio_tokenizer``: the codec's directory when it is not
    ``MODEL/audio_tokenizer`` (the released model and its tokenizer are two repositories).
    """
    if model_path is None and audio_tokenizer is None:
        raise ValueError(
            "factory_args.model_path: the Higgs Audio decoder needs a local checkpoint (serve --model PATH)"
        )
    if chunk_frames < 1 or lookahead < 0 or left_context < lookahead or (lookahead > 0 and left_context == 0):
        raise ValueError(
            f"need chunk_frames >= 1, lookahead >= 0 and left_context >= lookahead (> 0 with a look-ahead), "
            f"got {chunk_frames}, {lookahead}, {left_context}"
        )
    codec = AudioTokenizer(audio_tokenizer_path(model_path or "", audio_tokenizer), device)
    spf = codec.samples_per_frame

    def process(window: Window) -> AudioChunk | None:
        context = window.context
        held = min(lookahead, len(context))  # processed before, not yet given out
        start = len(context) - held
        end = len(context) + len(window.new) - (0 if window.final else lookahead)
        if end <= start:
            return None
        wav = codec.decode(torch.cat([context, window.new]))
        samples = np.ascontiguousarray(wav[start * spf : end * spf], dtype=np.float32)
        return AudioChunk(samples=samples, sample_rate=codec.sample_rate)

    def finish(_rid: str, _params: Mapping[str, Any], outputs: list[Any]) -> AudioResult:
        pieces = [output.samples for output in outputs]
        samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return AudioResult(samples=samples, sample_rate=codec.sample_rate)

    return StreamingScheduler(
        process,  # type: ignore[arg-type]  # an AudioChunk is emitted as it is, the audio terminal's contract
        left_context=max(left_context, 1),
        chunk_size=chunk_frames,
        units=_codes,
        finish=finish,  # type: ignore[arg-type]  # returns the typed AudioResult an audio terminal must
        finish_on=FinishOn.REQUEST,
        flush_on_end=True,
    )
