"""Waveforms out: float32 mono in [-1, 1] (as :mod:`omnictl.outputs` carries them) →
the bytes of one audio format, encoded as the audio is produced; base64 for JSON.

Formats (OpenAI's names; ``pcm`` is ``pcm16`` in chat completions):

* ``pcm16``: raw little-endian 16-bit mono at 24 kHz, the OpenAI convention clients rely
  on, so stages at another rate are resampled.
* ``wav``: PCM16 at the stage's own rate (the header says it). A streamed WAV is one
  header with its sizes marked unknown (FFmpeg's WAV muxer on an unseekable output, as
  OpenAI's streamed WAV) followed by raw pcm16 in every later chunk; a whole one
  (:func:`encode_whole`) has its real sizes.
* ``mp3`` (LAME), ``opus`` (libopus in Ogg, 48 kHz), ``aac`` (FFmpeg's AAC in ADTS),
  ``flac``.

Every container is FFmpeg's, through PyAV (no container code here): the muxer writes into
a sink that is drained after every chunk, so each chunk's bytes go out as soon as the
encoder hands them over. A stream is not seekable, so containers that keep a total in
their header (WAV's sizes, FLAC's STREAMINFO sample count) leave it unknown; players and
ffprobe read such streams.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnictl import audio
from omnictl.inputs import PCM16_RATE  # one definition for audio in and out


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
    # bitexact: no LIST/INFO chunk naming the encoder, the 44-byte header WAV readers expect
    "wav": Codec("wav", "pcm_s16le", None, None, "audio/wav", (("fflags", "+bitexact"),)),
    "mp3": Codec("mp3", "libmp3lame", None, 64_000, "audio/mpeg"),
    # Ogg pages of 100 ms (the muxer's default is one second): the stream keeps up with speech.
    "opus": Codec("ogg", "libopus", 48_000, 32_000, "audio/ogg", (("page_duration", "100000"),)),
    "aac": Codec("adts", "aac", None, 64_000, "audio/aac"),
    "flac": Codec("flac", "flac", None, None, "audio/flac"),
}
FORMATS = ("wav", "pcm16", "mp3", "opus", "aac", "flac")  # what an encoder accepts
MEDIA_TYPES = {"pcm16": "audio/pcm", **{name: codec.media_type for name, codec in CODECS.items()}}


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """To an encoder's rate: the toolkit's ``fast`` quality (linear; enough for speech at these rates)."""
    return audio.resample(samples, rate, target, quality="fast")


def encode_whole(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """One complete waveform (float32 mono) as a file of ``fmt`` (a WAV with its real sizes)."""
    if fmt == "pcm16":
        return audio.float_to_pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
    if fmt not in CODECS:
        raise ValueError(f"audio format {fmt!r} is not one of {', '.join(FORMATS)}")
    muxed = _Muxed(CODECS[fmt], sample_rate, seekable=True)  # the muxer goes back to write the totals
    return muxed.encode(samples, sample_rate) + muxed.finish()


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


class _File(io.BytesIO):
    """A seekable file for a whole encoding (the muxer goes back to write totals into its
    header): nothing is drained until the end, when the whole file is."""

    done = False

    def drain(self) -> bytes:
        return self.getvalue() if self.done else b""

    def close(self) -> None:  # the muxer closing its output must not discard the file
        pass


class _Muxed:
    """One PyAV output container with one mono audio stream, opened at the first chunk's rate."""

    def __init__(self, codec: Codec, sample_rate: int, seekable: bool = False) -> None:
        import av  # PyAV: FFmpeg's encoders and muxers, in its wheel

        self._sink: _Sink | _File = _File() if seekable else _Sink()
        options = {"flush_packets": "1", **dict(codec.container_options)}
        self._container: Any = av.open(self._sink, mode="w", format=codec.container, options=options)
        stream: Any = self._container.add_stream(codec.encoder, rate=codec.rate or sample_rate, layout="mono")
        if codec.bit_rate is not None:
            stream.bit_rate = codec.bit_rate
        self._resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=stream.rate)
        self._stream: Any = stream
        # Only WAV's header alone is a file FFmpeg reads back as 0 samples (FLAC's encoder
        # writes its own STREAMINFO at the end). MP3 and AAC (ADTS) have no file header:
        # 0 samples are 0 frames, no bytes; Ogg Opus's two header pages without an audio
        # page do not open in FFmpeg either (End of file), so no bytes is no worse.
        self._header_when_empty = codec.container == "wav"
        self.input_rate = sample_rate
        self._av = av

    def encode(self, samples: np.ndarray, sample_rate: int) -> bytes:
        if sample_rate != self.input_rate:  # one stage speaks at one rate; keep the stream's anyway
            samples = resample(samples, sample_rate, self.input_rate)
        if samples.size:
            clipped = np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)
            frame = self._av.AudioFrame.from_ndarray(
                np.ascontiguousarray(clipped)[None, :], format="flt", layout="mono"
            )
            frame.sample_rate = self.input_rate
            self._write(self._resampler.resample(frame))
        return self._sink.drain()

    def finish(self) -> bytes:
        self._write(self._resampler.resample(None))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        if self._header_when_empty:
            # No samples, no packet: PyAV writes the header at the first packet, so a WAV of
            # nothing closed as no file at all (""). Started here, it is a WAV of 0 samples.
            self._container.start_encoding()
        self._container.close()
        if isinstance(self._sink, _File):
            self._sink.done = True
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
            return audio.float_to_pcm16_bytes(resample(samples, sample_rate, PCM16_RATE))
        if self._muxed is None:
            self._muxed = _Muxed(CODECS[self.fmt], sample_rate)
        return self._muxed.encode(samples, sample_rate)

    def finish(self, sample_rate: int = 24_000) -> bytes:
        """The stream's last bytes (what a compressed format's encoder still held). A stream
        that never had audio ends as a file of 0 samples where the format has one (WAV's
        header, FLAC's), and as nothing for the frame-by-frame formats (mp3, aac, opus, pcm16)."""
        if self.fmt == "pcm16":
            return b""
        if self._muxed is None:
            self._muxed = _Muxed(CODECS[self.fmt], self._rate or sample_rate)
        muxed, self._muxed = self._muxed, None
        return muxed.finish() if muxed is not None else b""
