"""Waveforms out: float32 mono in [-1, 1] (as :mod:`omnictl.outputs` carries them) →
the bytes of one audio format, encoded as the audio is produced; base64 for JSON.

Formats (OpenAI's names; ``pcm`` is ``pcm16`` in chat completions):

* ``pcm16``: raw little-endian 16-bit mono at 24 kHz, the OpenAI convention clients rely
  on, so stages at another rate are resampled.
* ``wav``: PCM16 at the stage's own rate (the header says it). A streamed WAV is one
  header with its sizes marked unknown (as streaming WAV writers do, and OpenAI's
  streamed WAV) followed by raw pcm16 in every later chunk.
* ``mp3`` (LAME), ``opus`` (libopus in Ogg, 48 kHz), ``aac`` (FFmpeg's AAC in ADTS),
  ``flac``: encoded and muxed by FFmpeg through PyAV, into a sink that is drained after
  every chunk, so each chunk's bytes go out as soon as the encoder hands them over.
  The output is not seekable, so containers that keep a total in their header (FLAC's
  STREAMINFO sample count) leave it unknown; players and ffprobe read such streams.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnictl.inputs import PCM16_RATE  # one definition for audio in and out

_UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True)
class Codec:
    """How PyAV writes one format: container, encoder, fixed rate (None: the stage's), bit rate."""

    container: str
    encoder: str
    rate: int | None
    bit_rate: int | None
    media_type: str
    container_options: tuple[tuple[str, str], ...] = ()


CODECS = {
    "mp3": Codec("mp3", "libmp3lame", None, 64_000, "audio/mpeg"),
    # Ogg pages of 100 ms (the muxer's default is one second): the stream keeps up with speech.
    "opus": Codec("ogg", "libopus", 48_000, 32_000, "audio/ogg", (("page_duration", "100000"),)),
    "aac": Codec("adts", "aac", None, 64_000, "audio/aac"),
    "flac": Codec("flac", "flac", None, None, "audio/flac"),
}
FORMATS = ("wav", "pcm16", *CODECS)  # what an encoder accepts
MEDIA_TYPES = {"wav": "audio/wav", "pcm16": "audio/pcm", **{name: codec.media_type for name, codec in CODECS.items()}}


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear-interpolation resampling; enough for speech at these rates."""
    if rate == target or samples.size == 0:
        return samples
    count = max(1, round(samples.size * target / rate))
    positions = np.linspace(0.0, samples.size - 1, num=count, dtype=np.float64)
    resampled: np.ndarray = np.interp(positions, np.arange(samples.size), samples).astype(np.float32)
    return resampled


def pcm16_bytes(samples: np.ndarray) -> bytes:
    clipped = np.clip(samples, -1.0, 1.0)
    return bytes((clipped * 32767.0).round().astype("<i2").tobytes())


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte PCM16 mono RIFF header; ``data_bytes=None`` marks a stream of unknown length."""
    data_size = _UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff_size = _UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data" + struct.pack("<I", data_size)
    )


def encode_whole(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """One complete waveform (float32 mono) as a file of ``fmt`` (a WAV with its real sizes)."""
    if fmt == "pcm16":
        return pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
    if fmt == "wav":
        body = pcm16_bytes(samples)
        return wav_header(sample_rate, len(body)) + body
    encoder = AudioStreamEncoder(fmt)
    return encoder.encode(samples, sample_rate) + encoder.finish()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class _Sink:
    """A write-only, unseekable file for PyAV's muxer: collects bytes until drained."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def drain(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class _Muxed:
    """One PyAV output container with one mono audio stream, opened at the first chunk's rate."""

    def __init__(self, codec: Codec, sample_rate: int) -> None:
        import av  # PyAV: FFmpeg's encoders and muxers, in its wheel

        self._sink = _Sink()
        self._container: Any = av.open(self._sink, mode="w", format=codec.container,
                                       options={"flush_packets": "1"}, container_options=dict(codec.container_options))
        self._stream: Any = self._container.add_stream(codec.encoder, rate=codec.rate or sample_rate, layout="mono")
        if codec.bit_rate is not None:
            self._stream.bit_rate = codec.bit_rate
        self._resampler = av.AudioResampler(format=self._stream.codec_context.format.name, layout="mono",
                                            rate=self._stream.rate)
        self.input_rate = sample_rate
        self._av = av

    def encode(self, samples: np.ndarray, sample_rate: int) -> bytes:
        if sample_rate != self.input_rate:  # one stage speaks at one rate; keep the stream's anyway
            samples = resample(samples, sample_rate, self.input_rate)
        if samples.size:
            frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, np.float32)[None, :], format="flt",
                                                     layout="mono")
            frame.sample_rate = self.input_rate
            self._write(self._resampler.resample(frame))
        return self._sink.drain()

    def finish(self) -> bytes:
        self._write(self._resampler.resample(None))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.drain()

    def _write(self, frames: list[Any]) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)


@dataclass
class AudioStreamEncoder:
    """Encodes successive chunks of one response in ``fmt`` (one of :data:`FORMATS`);
    :meth:`finish` returns what the encoder still holds (a compressed format's last frames)."""

    fmt: str
    header_sent: bool = False
    seconds: float = 0.0  # audio produced so far
    _muxed: _Muxed | None = field(default=None, repr=False)
    _rate: int = 0

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"audio format {self.fmt!r} is not one of {', '.join(FORMATS)}")

    def encode(self, samples: np.ndarray, sample_rate: int) -> bytes:
        self.seconds += samples.size / sample_rate if sample_rate else 0.0
        self._rate = self._rate or sample_rate
        if self.fmt == "pcm16":
            return pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
        if self.fmt == "wav":
            body = pcm16_bytes(samples)
            if self.header_sent:
                return body
            self.header_sent = True
            return wav_header(sample_rate, None) + body
        if self._muxed is None:
            self._muxed = _Muxed(CODECS[self.fmt], sample_rate)
        return self._muxed.encode(samples, sample_rate)

    def finish(self, sample_rate: int = 24_000) -> bytes:
        """The stream's last bytes; for a stream that never had audio, a valid empty file."""
        if self.fmt == "pcm16":
            return b""
        if self.fmt == "wav":
            return b"" if self.header_sent else wav_header(self._rate or sample_rate, 0)
        if self._muxed is None:
            self._muxed = _Muxed(CODECS[self.fmt], self._rate or sample_rate)
        muxed, self._muxed = self._muxed, None
        return muxed.finish() if muxed is not None else b""
