"""The one input boundary: an OpenAI-style chat request, checked part by part, typed.

``{"messages": [...], "sampling": {...}, "voice": ...}``: OpenAI-style chat messages
whose content parts are ``text``, ``input_audio`` (base64 WAV / pcm16, or a numpy
array) and ``image_url`` (a data URL; a local path only when the caller allows it). :func:`parse_request` turns it
into a :class:`ChatRequest` or raises :class:`InvalidRequest` whose ``field`` names the
bad part, e.g. ``messages[0].content[1].input_audio.data``. Audio is decoded while
parsing (a broken WAV is a bad request, not a stage crash), and only there; images are
only checked, and loaded on demand with :func:`load_image`.

The HTTP server parses each request once and submits the typed :class:`ChatRequest`;
Python callers may submit the dict. An entry stage takes either through
:func:`as_chat_request`. The request types are :class:`~omnictl.wire.WireStruct` s, so
they reach the entry stage's process as the same types, audio samples as raw buffers.
Nothing here is model-specific: models decide what they do with each part.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Union

import msgspec
import numpy as np

# The audio toolkit's: imported by name here too, where callers have always found them.
from omnictl.audio import MAX_RATE as MAX_RATE
from omnictl.audio import MIN_RATE as MIN_RATE
from omnictl.audio import decode_base64, decode_budget, pcm16_base64, pcm16_to_float
from omnictl.audio import read_wav as read_wav
from omnictl.audio import resample as resample
from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.sampling import SamplingParams
from omnictl.wire import WireStruct

if TYPE_CHECKING:  # Pillow is only needed by topologies that take images
    from PIL.Image import Image

ROLES = ("system", "developer", "user", "assistant", "tool")
AUDIO_FORMATS = ("wav", "pcm16")
PCM16_RATE = 24_000  # the OpenAI convention for raw pcm16
ARRAY_RATE = 16_000  # numpy arrays without a sample_rate are taken as 16 kHz
PARAM_KEYS = ("sampling", "voice", "speed")  # what every stage sees of a request (RequestContext.params)
SPEECH_SAMPLING = "speech_sampling"  # a SpeechRequest's sampling, in RequestContext.params
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
# Leading bytes of the image formats the image processors read.
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"RIFF")


def _fail(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {problem}", field=field)


def _speed(value: Any) -> float:
    """A speaking speed as a float: a number from 0.25 to 4.0 (OpenAI's range; 2.0 is twice as fast)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.25 <= value <= 4.0:
        raise _fail("speed", f"must be a number from 0.25 to 4.0, got {value!r}")
    return float(value)


def is_language_code(value: Any) -> bool:
    """Whether ``value`` has the shape of a language code ('en', 'fr'...): 2 to 8 letters. The
    recognizer then says whether it knows it."""
    return isinstance(value, str) and 2 <= len(value) <= 8 and value.isalpha()


def _set(obj: msgspec.Struct, name: str, value: Any) -> None:
    # The request types are frozen (stages share one by reference); __post_init__ may
    # still normalize a field, e.g. the list msgpack hands back where a tuple was sent.
    msgspec.structs.force_setattr(obj, name, value)


# Frozen: a fan-out passes one request object to several stages of a process. kw_only on
# each class: msgspec applies it only to the fields the class itself declares.
class TextPart(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _fail("text", f"must be a string, got {_kind(self.text)}")


class AudioPart(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    samples: np.ndarray  # float32 mono in [-1, 1], at ``sample_rate``
    sample_rate: int
    field: str = "audio"  # where it sat in the request, for errors raised later

    def __post_init__(self) -> None:
        # O(1) checks only: this runs again on every process hop; the NaN scan is parsing's.
        samples = self.samples
        if not isinstance(samples, np.ndarray) or samples.ndim != 1 or samples.dtype != np.float32:
            got = (
                f"{samples.dtype} array of shape {samples.shape}" if isinstance(samples, np.ndarray) else _kind(samples)
            )
            raise _fail(self.field, f"samples must be a 1-D float32 array (mono, in [-1, 1]), got {got}")
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:
            raise _fail(f"{self.field}.sample_rate", f"must be a positive integer (Hz), got {rate!r}")
        _set(self, "sample_rate", int(rate))


class ImagePart(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    field: str
    data: bytes | None = None  # from a data URL
    path: str | None = None  # a local file (a str, not a Path: it crosses processes as msgpack)

    def __post_init__(self) -> None:
        if (self.data is None) == (self.path is None):
            raise _fail(self.field, "an image part holds exactly one of data and path")


Part = Union[TextPart, AudioPart, ImagePart]
_PART_TYPES = (TextPart, AudioPart, ImagePart)


class ChatMessage(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    role: str
    parts: tuple[Part, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise _fail("role", f"must be one of {', '.join(ROLES)}, got {self.role!r}")
        _set(self, "parts", tuple(self.parts))
        for i, part in enumerate(self.parts):
            if not isinstance(part, _PART_TYPES):
                raise _fail(f"parts[{i}]", f"must be a TextPart, AudioPart or ImagePart, got {_kind(part)}")

    def text(self) -> str:
        """The message's text parts joined by a space (media parts skipped)."""
        return " ".join(part.text for part in self.parts if isinstance(part, TextPart))

    def audio(self) -> list[AudioPart]:
        return [part for part in self.parts if isinstance(part, AudioPart)]


class RecognitionOptions(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    """What ``/v1/audio/transcriptions`` and ``/translations`` ask of speech recognition."""

    task: str = "transcribe"  # or "translate": into English
    prompt: str | None = None  # text in the style to expect (Whisper's initial prompt)
    temperature: float | None = None  # None: the recognizer's own
    timestamps: bool = False  # segments with start and end times
    words: bool = False  # word timestamps too
    stream: bool = False  # stream each segment as it is decoded

    def __post_init__(self) -> None:
        if self.task not in ("transcribe", "translate"):
            raise _fail("task", f"must be 'transcribe' or 'translate', got {self.task!r}")
        if self.temperature is not None and not 0 <= self.temperature <= 1:
            raise _fail("temperature", f"must be between 0 and 1, got {self.temperature!r}")


class ChatRequest(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    voice: str | None = None
    speed: float = 1.0  # of the spoken answer, 0.25 to 4.0 (realtime's audio.output.speed); the TTS stage applies it
    language: str | None = None  # of the spoken parts (ISO-639-1); None: the recognizer's default
    recognition: RecognitionOptions | None = None  # the audio endpoints' options; None: a chat's defaults

    def __post_init__(self) -> None:
        _set(self, "messages", tuple(self.messages))
        if not self.messages:
            raise _fail("messages", "must contain at least one message")
        for i, message in enumerate(self.messages):
            if not isinstance(message, ChatMessage):
                raise _fail(f"messages[{i}]", f"must be a ChatMessage, got {_kind(message)}")
        if not isinstance(self.sampling, SamplingParams):
            raise _fail("sampling", f"must be a SamplingParams, got {_kind(self.sampling)}")
        _set(self, "speed", _speed(self.speed))

    def last_user_message(self) -> ChatMessage | None:
        for message in reversed(self.messages):
            if message.role == "user":
                return message
        return None

    def params(self) -> dict[str, Any]:
        """Its per-request parameters as every stage sees them (``RequestContext.params``)."""
        params: dict[str, Any] = {"sampling": self.sampling.as_dict()}
        if self.voice is not None:
            params["voice"] = self.voice
        if self.speed != 1.0:
            params["speed"] = self.speed
        return params


class SpeechRequest(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    """Text to speak as it is (``/v1/audio/speech``): no recognition, no language model.

    A topology serves it when its entry stage routes it straight to an audio terminal."""

    text: str
    voice: str | None = None
    speed: float = 1.0  # 0.25 to 4.0 (OpenAI's range); the TTS stage applies it
    # What a speech client asks of a generative TTS (vLLM's and SGLang's speech servers take
    # these); the TTS stage honours them or refuses them by name. Not ``params["sampling"]``:
    # a chat request's sampling is its language model's, and every stage sees it.
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise _fail("input", "must be non-empty text to speak")
        if self.voice is not None and (not isinstance(self.voice, str) or not self.voice):
            raise _fail("voice", f"must be a voice name (a non-empty string), got {self.voice!r}")
        _set(self, "speed", _speed(self.speed))
        if not isinstance(self.sampling, SamplingParams):
            raise _fail("sampling", f"must be a SamplingParams, got {_kind(self.sampling)}")

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {} if self.voice is None else {"voice": self.voice}
        if self.speed != 1.0:
            params["speed"] = self.speed
        if self.sampling.given():
            params[SPEECH_SAMPLING] = self.sampling.as_dict()
        return params


def as_chat_request(inputs: Any) -> ChatRequest:
    """What an entry stage calls on its input: a :class:`ChatRequest` as is (the HTTP
    server already parsed it), a ``{"messages", ...}`` mapping parsed (Python callers)."""
    if isinstance(inputs, ChatRequest):
        return inputs
    if isinstance(inputs, Mapping):
        return parse_request(inputs, local_images=True)  # a Python caller on this host may name its files
    raise _fail("inputs", f"must be a ChatRequest or a mapping with 'messages', got {_kind(inputs)}")


def request_params(inputs: Any) -> dict[str, Any]:
    """The parameters every stage sees for a request with these ``inputs``: its
    ``sampling``, ``voice`` and ``speed``. A mapping's are passed as given (stages validate them)."""
    if isinstance(inputs, (ChatRequest, SpeechRequest)):
        return inputs.params()
    if isinstance(inputs, dict):
        return {key: inputs[key] for key in PARAM_KEYS if key in inputs}
    return {}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _expect(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    # JSON `true` is a Python int; it is never a valid number here
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _fail(field, f"must be {what}, got {value!r}")
    if not isinstance(value, kind):
        raise _fail(field, f"must be {what}, got {_kind(value)}")
    return value


def _no_unknown_keys(obj: Mapping[str, Any], allowed: set[str] | tuple[str, ...], field: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _fail(f"{field}.{key}", f"unknown field (expected one of {', '.join(sorted(allowed))})")


@dataclass(frozen=True)
class _Bounds:
    audio_bytes: int | None
    audio_seconds: float | None
    local_images: bool


def parse_request(
    inputs: Mapping[str, Any],
    *,
    max_audio_bytes: int | None = None,
    max_audio_seconds: float | None = None,
    local_images: bool = False,
) -> ChatRequest:
    """Check ``inputs`` and decode its audio; raises :class:`InvalidRequest` naming the bad part.

    ``max_audio_bytes`` caps the decoded size of one base64 audio part: a bigger one
    raises :class:`PayloadTooLarge` before it is decoded; ``max_audio_seconds`` caps one
    part's duration (:class:`PayloadTooLarge` too). ``local_images`` lets ``image_url``
    name a file on this host: only for trusted Python callers, never for a request off
    the network (it would answer whether any file exists, and read any image the server can).
    """
    bounds = _Bounds(max_audio_bytes, max_audio_seconds, local_images)
    _expect(inputs, Mapping, "inputs", "an object")
    _no_unknown_keys(inputs, {"messages", "sampling", "voice", "speed", "language"}, "inputs")
    messages = _expect(inputs.get("messages"), list, "messages", "a list of chat messages")
    if not messages:
        raise _fail("messages", "must contain at least one message")
    voice = inputs.get("voice")
    if voice is not None and (not isinstance(voice, str) or not voice):
        raise _fail("voice", f"must be a voice name (a non-empty string), got {voice!r}")
    language = inputs.get("language")
    if language is not None and not is_language_code(language):
        raise _fail("language", f"must be a language code such as 'en', got {language!r}")
    return ChatRequest(
        messages=tuple(_parse_message(message, f"messages[{i}]", bounds) for i, message in enumerate(messages)),
        sampling=SamplingParams.from_mapping(inputs.get("sampling")),
        voice=voice,
        speed=_speed(inputs.get("speed", 1.0)),
        language=language,
    )


def _parse_message(message: Any, field: str, bounds: _Bounds) -> ChatMessage:
    _expect(message, Mapping, field, "an object with 'role' and 'content'")
    _no_unknown_keys(message, _MESSAGE_KEYS, field)
    role = message.get("role")
    if role not in ROLES:
        raise _fail(f"{field}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    content = message.get("content")
    if content is None and role == "assistant":  # an assistant turn that only called tools
        return ChatMessage(role=role)
    if isinstance(content, str):
        return ChatMessage(role=role, parts=(TextPart(text=content),))
    _expect(content, list, f"{field}.content", "a string or a list of content parts")
    parts = tuple(_parse_part(part, f"{field}.content[{j}]", bounds) for j, part in enumerate(content))
    return ChatMessage(role=role, parts=parts)


def _parse_part(part: Any, field: str, bounds: _Bounds) -> Part:
    _expect(part, Mapping, field, "an object with a 'type'")
    kind = part.get("type")
    if kind == "text":
        _no_unknown_keys(part, {"type", "text"}, field)
        return TextPart(text=_expect(part.get("text"), str, f"{field}.text", "a string"))
    if kind == "input_audio":
        _no_unknown_keys(part, {"type", "input_audio"}, field)
        audio = _expect(part.get("input_audio"), Mapping, f"{field}.input_audio", "an object")
        budget = None if bounds.audio_seconds is None else decode_budget(bounds.audio_seconds)
        part_ = _parse_audio(audio, f"{field}.input_audio", bounds.audio_bytes, budget)
        seconds = part_.samples.size / part_.sample_rate
        if bounds.audio_seconds is not None and seconds > bounds.audio_seconds:
            raise PayloadTooLarge(
                f"{field}.input_audio.data: {seconds:.0f} s of audio; the limit is {bounds.audio_seconds:g} s",
                field=f"{field}.input_audio.data",
            )
        return part_
    if kind == "image_url":
        _no_unknown_keys(part, {"type", "image_url"}, field)
        image = _expect(part.get("image_url"), Mapping, f"{field}.image_url", "an object with a 'url'")
        _no_unknown_keys(image, {"url", "detail"}, f"{field}.image_url")
        url = _expect(image.get("url"), str, f"{field}.image_url.url", "a string")
        return _parse_image(url, f"{field}.image_url.url", bounds.local_images)
    raise _fail(f"{field}.type", f"must be text, input_audio or image_url, got {kind!r}")


def _parse_audio(
    audio: Mapping[str, Any], field: str, max_audio_bytes: int | None, max_samples: int | None = None
) -> AudioPart:
    _no_unknown_keys(audio, {"data", "format", "sample_rate"}, field)
    data = audio.get("data")
    rate = audio.get("sample_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE):
        raise _fail(f"{field}.sample_rate", f"must be an integer between {MIN_RATE} and {MAX_RATE} (Hz), got {rate!r}")
    if isinstance(data, np.ndarray):
        return AudioPart(samples=_array_samples(data, f"{field}.data"), sample_rate=rate or ARRAY_RATE, field=field)
    fmt = audio.get("format", "wav")
    if fmt not in AUDIO_FORMATS:
        raise _fail(f"{field}.format", f"must be one of {', '.join(AUDIO_FORMATS)}, got {fmt!r}")
    encoded = _expect(data, str, f"{field}.data", "a base64 string or a numpy array")
    if fmt == "pcm16":
        samples = pcm16_base64(encoded, f"{field}.data", max_audio_bytes)
        return AudioPart(samples=_array_samples(samples, f"{field}.data"), sample_rate=rate or PCM16_RATE, field=field)
    raw = decode_base64(encoded, f"{field}.data", max_audio_bytes)
    if rate is not None:
        raise _fail(f"{field}.sample_rate", "a WAV file carries its own sample rate; drop this field")
    samples, wav_rate = read_wav(raw, f"{field}.data", max_samples)
    return AudioPart(samples=_array_samples(samples, f"{field}.data"), sample_rate=wav_rate, field=field)


def _array_samples(array: np.ndarray, field: str) -> np.ndarray:
    if array.ndim != 1:
        raise _fail(field, f"audio must be mono (a 1-D array), got shape {array.shape}")
    if array.size == 0:
        raise _fail(field, "audio is empty")
    if array.dtype == np.int16:
        return pcm16_to_float(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise _fail(field, f"audio arrays must be float (in [-1, 1]) or int16, got {array.dtype}")
    samples = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(samples).all():
        raise _fail(field, "audio contains NaN or infinite samples")
    return samples


def _parse_image(url: str, field: str, local: bool) -> ImagePart:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64") or not header[5:].startswith("image/"):
            raise _fail(field, "a data URL must look like 'data:image/<type>;base64,<data>'")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _fail(field, f"not valid base64 ({exc})") from exc
        if not data.startswith(_IMAGE_MAGIC):
            raise _fail(field, "the data is not a PNG, JPEG, GIF, BMP or WebP image")
        return ImagePart(field=field, data=data)
    if url.startswith(("http://", "https://")):
        raise _fail(field, "remote image URLs are not fetched; send a data URL")
    if not local:  # says nothing about the path: whether it exists is none of the caller's business
        raise _fail(field, "only data URLs are accepted ('data:image/<type>;base64,<data>')")
    path = Path(url.removeprefix("file://")).expanduser()
    if not path.is_file():
        raise _fail(field, f"no image file at {str(path)!r}")
    return ImagePart(field=field, path=str(path))


def decode_audio(part: AudioPart, sample_rate: int) -> np.ndarray:
    """The part's samples as float32 mono at ``sample_rate`` (resampled; already decoded)."""
    return resample(part.samples, part.sample_rate, sample_rate)


def load_image(part: ImagePart) -> Image:
    """The part's image as an RGB PIL image (needs Pillow)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("reading image inputs needs Pillow: pip install pillow") from exc
    try:
        image = Image.open(io.BytesIO(part.data) if part.data is not None else str(part.path))
        return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise _fail(part.field, f"cannot read the image ({exc})") from exc
