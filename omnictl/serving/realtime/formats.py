"""The session's audio formats, converted at the edge: everything inside is pcm16 at 24 kHz.

``audio/pcm`` is 16-bit little-endian mono at 24 kHz (the protocol's default);
``audio/pcmu`` (G.711 mu-law) and ``audio/pcma`` (G.711 A-law) are 8-bit at 8 kHz, what
telephony speaks. A client's audio is decoded and resampled to 24 kHz as it is appended
(the buffer, VAD and the pipeline see one format); each answer's audio delta is resampled
to 8 kHz and encoded on its way out. The G.711 tables are the ITU-T reference (the same
bytes Python's former ``audioop`` gives), in numpy.

A stream of chunks goes through a :class:`Pcm16Decoder` (:meth:`AudioCodec.decoder`) or a
:class:`Pcm16Encoder` (:meth:`AudioCodec.encoder`), which keep one resampler open from one
chunk to the next (:class:`~omnictl.audio.resample.StreamResampler`): the same samples
whatever sizes the chunks had. :meth:`AudioCodec.to_pcm16` and :meth:`AudioCodec.from_pcm16`
convert one whole piece (an item's audio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnictl.audio import float_to_pcm16, pcm16_to_float, resample
from omnictl.audio.resample import StreamResampler
from omnictl.inputs import PCM16_RATE
from omnictl.serving.common.echo import clip_repr
from omnictl.serving.realtime.events import AudioFormat, EventError

G711_RATE = 8_000
_ULAW_BIAS = 0x84
_ULAW_CLIP = 32_635


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples as G.711 mu-law bytes."""
    x = pcm.astype(np.int32) >> 2  # the reference works on 14 bits
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _ULAW_CLIP >> 2) + (_ULAW_BIAS >> 2)
    exponent = np.clip(np.floor(np.log2(magnitude)).astype(np.int32) - 5, 0, 7)
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def ulaw_decode(data: np.ndarray) -> np.ndarray:
    """G.711 mu-law bytes as int16 samples."""
    b = ~data.astype(np.int32) & 0xFF
    exponent, mantissa = (b >> 4) & 0x07, b & 0x0F
    magnitude = (((mantissa << 3) + _ULAW_BIAS) << exponent) - _ULAW_BIAS
    return np.where(b & 0x80, -magnitude, magnitude).astype(np.int16)


def alaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples as G.711 A-law bytes."""
    x = pcm.astype(np.int32)
    mask = np.where(x >= 0, 0xD5, 0x55)
    magnitude = np.minimum(np.where(x >= 0, x, -x - 1), 32_767)
    exponent = np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 7, 0, 7)
    shift = np.where(exponent == 0, 4, exponent + 3)
    mantissa = (magnitude >> shift) & 0x0F
    return (((exponent << 4) | mantissa) ^ mask).astype(np.uint8)


def alaw_decode(data: np.ndarray) -> np.ndarray:
    """G.711 A-law bytes as int16 samples."""
    a = data.astype(np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


@dataclass(frozen=True)
class AudioCodec:
    """One of the protocol's audio formats, and its conversion to and from pcm16 at 24 kHz."""

    type: str
    rate: int
    sample_bytes: int

    @property
    def bytes_per_second(self) -> int:
        return self.rate * self.sample_bytes

    def describe(self) -> dict[str, object]:
        """As the session object reports it (G.711 formats carry no rate: 8 kHz is implied)."""
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}

    def to_pcm16(self, raw: bytes) -> bytes:
        """Client audio in this format as pcm16 at 24 kHz."""
        if self.type == "audio/pcm":
            return raw
        codes = np.frombuffer(raw, np.uint8)
        pcm = ulaw_decode(codes) if self.type == "audio/pcmu" else alaw_decode(codes)
        return float_to_pcm16(resample(pcm16_to_float(pcm), self.rate, PCM16_RATE)).astype("<i2").tobytes()

    def from_pcm16(self, pcm: bytes) -> bytes:
        """pcm16 at 24 kHz in this format."""
        if self.type == "audio/pcm":
            return pcm
        samples = resample(pcm16_to_float(pcm), PCM16_RATE, self.rate)
        pcm8k = float_to_pcm16(samples)
        return bytes(ulaw_encode(pcm8k) if self.type == "audio/pcmu" else alaw_encode(pcm8k))

    def decoder(self) -> Pcm16Decoder:
        """A stream of chunks in this format as pcm16 at 24 kHz, one resampler kept throughout."""
        return Pcm16Decoder(self)

    def encoder(self) -> Pcm16Encoder:
        """A stream of pcm16 at 24 kHz in this format, one resampler kept throughout."""
        return Pcm16Encoder(self)


class Pcm16Decoder:
    """A client's stream of chunks in ``codec`` as pcm16 at 24 kHz. G.711's 8 kHz goes through
    one stateful resampler (a new one per chunk filtered each chunk's edges against silence).
    Each chunk gives exactly three samples per byte, as before: the filter's lag is paid once,
    as 6.25 ms of silence at the start of the stream (``StreamResampler(aligned=True)``)."""

    def __init__(self, codec: AudioCodec) -> None:
        self.codec = codec
        self._resampler = None if codec.type == "audio/pcm" else StreamResampler(codec.rate, PCM16_RATE, aligned=True)

    def decode(self, raw: bytes) -> bytes:
        if self._resampler is None:
            return raw
        codes = np.frombuffer(raw, np.uint8)
        pcm = ulaw_decode(codes) if self.codec.type == "audio/pcmu" else alaw_decode(codes)
        return float_to_pcm16(self._resampler.push(pcm16_to_float(pcm))).astype("<i2").tobytes()


class Pcm16Encoder:
    """A stream of pcm16 at 24 kHz in ``codec`` (an answer's audio deltas), one resampler
    kept throughout. Each delta gives exactly its length at 8 kHz, as before, the filter's lag
    paid once as 5.5 ms of silence at the start; :meth:`flush` gives what that holds back."""

    def __init__(self, codec: AudioCodec) -> None:
        self.codec = codec
        self._resampler = None if codec.type == "audio/pcm" else StreamResampler(PCM16_RATE, codec.rate, aligned=True)

    def encode(self, pcm: bytes) -> bytes:
        if self._resampler is None:
            return pcm
        return self._g711(self._resampler.push(pcm16_to_float(pcm)))

    def flush(self) -> bytes:
        return b"" if self._resampler is None else self._g711(self._resampler.flush())

    def _g711(self, samples: np.ndarray) -> bytes:
        pcm8k = float_to_pcm16(samples)
        return bytes(ulaw_encode(pcm8k) if self.codec.type == "audio/pcmu" else alaw_encode(pcm8k))


PCM = AudioCodec("audio/pcm", PCM16_RATE, 2)
CODECS = {c.type: c for c in (PCM, AudioCodec("audio/pcmu", G711_RATE, 1), AudioCodec("audio/pcma", G711_RATE, 1))}


def codec_for(fmt: AudioFormat, param: str, event_id: str | None) -> AudioCodec:
    """The codec ``fmt`` names; an :class:`EventError` naming ``param.type`` or ``param.rate`` otherwise."""
    codec = CODECS.get(fmt.type)
    if codec is None:
        raise EventError(
            f"{param}.type {clip_repr(fmt.type, 64)} is not an audio format this server takes ({', '.join(CODECS)})",
            "unsupported_audio_format",
            f"{param}.type",
            event_id,
        )
    if fmt.rate is not None and fmt.rate != codec.rate:
        raise EventError(
            f"{param}.rate: {fmt.type} is {codec.rate} Hz here, got {fmt.rate}",
            "unsupported_audio_format",
            f"{param}.rate",
            event_id,
        )
    return codec
