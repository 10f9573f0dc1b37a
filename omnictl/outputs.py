"""What a terminal stage streams and returns, by modality: the one output contract.

A terminal of modality ``text`` streams :class:`TextDelta` and returns :class:`TextResult`;
one of modality ``audio`` streams :class:`AudioChunk` and returns :class:`AudioResult`;
one of modality ``transcript`` (speech recognition only) returns a :class:`Transcript`.
Any other modality is free-form: its data reaches the caller as the stage sent it.
The Stage checks every output of a ``text``/``audio``/``transcript`` terminal with :func:`check_output`
and fails that request (naming the stage, the modality and what was wrong) on a
mismatch, so a broken model is reported where it broke, not in the HTTP layer.

The constructors check their fields too: ``AudioChunk(samples=..., sample_rate=0)``
raises at once, in the model's own code.

Subclasses are welcome (the autoregressive scheduler streams :class:`TokenDelta`, a
``TextDelta`` that also carries token ids and hidden states), so a stage that emits
more than the contract still satisfies it. All are :class:`~omnictl.wire.WireStruct`,
so they arrive in the caller's process as the same types.
"""

from __future__ import annotations

import enum
import sys
from typing import Any, Union

import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.wire import WireStruct

TEXT = "text"
AUDIO = "audio"
TRANSCRIPT = "transcript"


class FinishReason(str, enum.Enum):
    """Why a text answer ended (the OpenAI ``finish_reason`` values omnictl produces)."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens reached


def _require(ok: bool, cls: type, problem: str) -> None:
    if not ok:
        raise TypeError(f"{cls.__name__}: {problem}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class TextDelta(WireStruct):
    """A piece of streamed text, to append to what came before."""

    text: str

    def __post_init__(self) -> None:
        _require(isinstance(self.text, str), type(self), f"text must be a str, got {type(self.text).__name__}")


class TopLogprob(WireStruct):
    """One likely token at a position: its text, log probability and UTF-8 bytes (OpenAI's shape)."""

    token: str
    logprob: float
    bytes: list[int] = []


class TokenLogprob(TopLogprob):
    """A chosen token's log probability, and the most likely tokens at its position
    (what a request's ``logprobs`` / ``top_logprobs`` ask for)."""

    top_logprobs: list[TopLogprob] = []


class TextResult(WireStruct):
    """A text terminal's result: the whole text, why it ended, and token usage; with
    ``logprobs`` when the request asked for them (one per generated token)."""

    text: str
    finish_reason: FinishReason = FinishReason.STOP
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None

    def __post_init__(self) -> None:
        cls = type(self)
        _require(isinstance(self.text, str), cls, f"text must be a str, got {type(self.text).__name__}")
        try:
            self.finish_reason = FinishReason(self.finish_reason)
        except ValueError:
            allowed = ", ".join(reason.value for reason in FinishReason)
            raise TypeError(
                f"{cls.__name__}: finish_reason must be one of {allowed}, got {self.finish_reason!r}"
            ) from None
        for name in ("prompt_tokens", "completion_tokens"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 0, cls, f"{name} must be an integer >= 0, got {value!r}")
            setattr(self, name, int(value))
        _require(
            self.logprobs is None or all(isinstance(item, TokenLogprob) for item in self.logprobs),
            cls,
            "logprobs must be None or a list of TokenLogprob",
        )

    def plain(self) -> TextResult:
        """Only the contract's fields: what a text terminal returns for an upstream's
        richer result (a :class:`TokenResult`'s token ids and hidden states dropped)."""
        return TextResult(
            text=self.text,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            logprobs=self.logprobs,
        )


def as_samples(audio: Any, where: str) -> np.ndarray:
    """``audio`` (numpy array, torch tensor or list of floats) as mono float32 samples."""
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    if torch is not None and isinstance(audio, torch.Tensor):
        audio = audio.detach().to("cpu", torch.float32).numpy()
    if isinstance(audio, (list, tuple)):
        audio = np.asarray(audio, dtype=np.float32)
    if not isinstance(audio, np.ndarray):
        raise TypeError(f"{where}: samples must be a numpy array or a torch tensor, got {type(audio).__name__}")
    if audio.ndim == 2 and 1 in audio.shape:  # (1, n) or (n, 1): one channel
        audio = audio.reshape(-1)
    if audio.ndim != 1:
        raise TypeError(f"{where}: samples must be mono (1-D), got shape {audio.shape}")
    if audio.dtype == np.int16:
        return pcm16_to_float(audio)
    if not np.issubdtype(audio.dtype, np.floating):
        raise TypeError(f"{where}: samples must be float in [-1, 1] (or int16), got {audio.dtype}")
    return np.ascontiguousarray(audio, dtype=np.float32)


class AudioChunk(WireStruct):
    """A piece of streamed audio: mono float32 samples at ``sample_rate``, and what it says."""

    samples: np.ndarray
    sample_rate: int
    transcript: str = ""

    def __post_init__(self) -> None:
        cls = type(self)
        self.samples = as_samples(self.samples, cls.__name__)
        _require(
            _is_int(self.sample_rate) and self.sample_rate > 0,
            cls,
            f"sample_rate must be a positive integer (Hz), got {self.sample_rate!r}",
        )
        self.sample_rate = int(self.sample_rate)
        _require(
            isinstance(self.transcript, str), cls, f"transcript must be a str, got {type(self.transcript).__name__}"
        )


class AudioResult(AudioChunk):
    """An audio terminal's result: the whole waveform and its whole transcript."""


def transcript_delta(spoken: str, words: str) -> str:
    """What a client appends to ``spoken`` (the transcripts of the audio pieces so far, as
    sent) for the next piece, which says ``words``. A TTS says its pieces without the space
    between them ("The capital of France", "is Paris."): each piece after the first brings
    its space, unless one side already has it. Chat completions and realtime both send this."""
    if words and spoken and not spoken[-1].isspace() and not words[0].isspace():
        return " " + words
    return words


class TokenDelta(TextDelta):
    """What an autoregressive stage streams: new tokens, their text, and optionally the
    hidden state that produced each token (``hidden[i]`` for ``token_ids[i]``)."""

    token_ids: list[int] = []
    hidden: Any = None  # a [n, H] tensor when the scheduler emits hidden states


class TokenResult(TextResult):
    """What an autoregressive stage returns: a :class:`TextResult` with every token id
    (a stop token ends the answer but is not among them) and optionally every hidden state."""

    token_ids: list[int] = []
    hidden: Any = None


class TranscriptWord(WireStruct):
    """One recognized word and when it is said (seconds from the clip's start); ``probability``
    is the recognizer's confidence in it (Whisper: the mean of its tokens' probabilities)."""

    word: str
    start: float
    end: float
    probability: float = 1.0


class TranscriptSegment(WireStruct):
    """One decoded segment (Whisper's unit: a phrase between two timestamps)."""

    id: int
    start: float
    end: float
    text: str
    tokens: list[int] = []
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0
    words: list[TranscriptWord] = []


class Transcript(WireStruct):
    """A ``transcript`` terminal's result: what speech recognition heard in the request's
    (last) spoken part, its language, and how many seconds of audio it heard; with
    ``segments`` (and their words) when the request asked for timestamps. ``task`` is
    ``translate`` when the text is Whisper's English translation of the speech.

    Streamed, a chunk is a Transcript holding one new segment (``text`` its text)."""

    text: str
    language: str | None = None
    duration: float = 0.0
    segments: list[TranscriptSegment] = []
    task: str = "transcribe"

    def __post_init__(self) -> None:
        cls = type(self)
        _require(isinstance(self.text, str), cls, f"text must be a str, got {type(self.text).__name__}")
        _require(
            self.language is None or isinstance(self.language, str),
            cls,
            f"language must be a str or None, got {self.language!r}",
        )
        _require(
            isinstance(self.duration, (int, float)) and self.duration >= 0,
            cls,
            f"duration must be seconds >= 0, got {self.duration!r}",
        )
        self.duration = float(self.duration)


# A streamed transcription's chunk whose ``task`` is this holds the whole transcript so far,
# asked for before the input ends (a realtime answer started at a pause), not a new segment.
TENTATIVE = "tentative"

TerminalOutput = Union[TextDelta, TextResult, AudioChunk, AudioResult, Transcript]
_EXPECTED: dict[str, tuple[type, type]] = {
    TEXT: (TextDelta, TextResult),
    AUDIO: (AudioChunk, AudioResult),
    TRANSCRIPT: (Transcript, Transcript),  # nothing streams; a chunk, if any, is a partial transcript
}


def check_output(modality: str, final: bool, data: Any) -> str | None:
    """Why ``data`` breaks the output contract of a ``modality`` terminal, or None.

    ``final``: ``data`` is the result (else a stream chunk). Free-form modalities pass.
    """
    expected = _EXPECTED.get(modality)
    if expected is None:
        return None
    cls = expected[1] if final else expected[0]
    if final and modality == AUDIO:
        ok = isinstance(data, AudioResult)
    elif not final and modality == AUDIO:
        ok = isinstance(data, AudioChunk) and not isinstance(data, AudioResult)
    else:
        ok = isinstance(data, cls)
    if ok:
        return None
    what = "result" if final else "stream chunk"
    got = type(data).__name__
    if isinstance(data, dict):
        got = f"a dict with keys {sorted(map(str, data))}"
    return f"a {modality!r} terminal's {what} must be omnictl.outputs.{cls.__name__}, got {got}"
