"""An uploaded audio file (``/v1/audio/transcriptions`` and ``/translations``) → float32 mono.

WAV is read by :func:`omnictl.inputs.read_wav` (the same reader as chat's input audio);
everything else FFmpeg decodes (through PyAV): mp3, m4a/AAC, Ogg (Opus, Vorbis), WebM,
FLAC, what browsers and phones record. The file is decoded once, here, before the
request is admitted to the pipeline. The duration limit is checked twice: against what
the container's header claims, before a single frame is decoded (a header claiming
hours is refused at once), and against what decoding actually produced, stopping as
soon as it goes over (a header may lie the other way).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from omnictl.exceptions import InvalidRequest, PayloadTooLarge
from omnictl.inputs import MAX_RATE, MIN_RATE, read_wav

_TIME_BASE = 1_000_000  # FFmpeg's AV_TIME_BASE: container durations are in microseconds


def _bad(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"'{field}' {problem}", field=field)


def _too_long(field: str, seconds: float, limit: float, claimed: bool) -> PayloadTooLarge:
    what = "its header says it lasts" if claimed else "it lasts over"
    return PayloadTooLarge(f"'{field}' is too long: {what} {seconds:.0f} s; the limit is {limit:g} s", field=field)


def decode_audio_file(data: bytes, field: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate; InvalidRequest naming ``field`` for a file
    FFmpeg cannot read or that holds no audio, PayloadTooLarge for one over ``max_seconds``."""
    if not data:
        raise _bad(field, "is empty")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        samples, rate = read_wav(data, field)
        if samples.size == 0:
            raise _bad(field, "holds no audio")
        if samples.size / rate > max_seconds:
            raise _too_long(field, samples.size / rate, max_seconds, claimed=False)
        return samples, rate
    return _decode_with_ffmpeg(data, field, max_seconds)


def _decode_with_ffmpeg(data: bytes, field: str, max_seconds: float) -> tuple[np.ndarray, int]:
    import av  # PyAV: FFmpeg's demuxers and decoders, in its wheel

    try:
        container: Any = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise _bad(field, f"is not an audio file FFmpeg can read ({_reason(exc)})") from exc
    with container:
        if not container.streams.audio:
            raise _bad(field, "has no audio stream")
        stream = container.streams.audio[0]
        claimed = _claimed_seconds(container, stream)
        if claimed is not None and claimed > max_seconds:
            raise _too_long(field, claimed, max_seconds, claimed=True)
        rate = stream.codec_context.sample_rate or stream.rate
        if not rate or not MIN_RATE <= rate <= MAX_RATE:
            raise _bad(field, f"has a sample rate of {rate} Hz; it must be between {MIN_RATE} and {MAX_RATE} Hz")
        # Decoded frames come in the codec's own layout (planar, several channels): one
        # resampler turns them into float mono at the stream's rate.
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        pieces: list[np.ndarray] = []
        total, limit = 0, int(max_seconds * rate) + 1
        try:
            for frame in container.decode(stream):
                for mono in resampler.resample(frame):
                    piece = mono.to_ndarray().reshape(-1)
                    total += piece.size
                    if total > limit:
                        raise _too_long(field, total / rate, max_seconds, claimed=False)
                    pieces.append(piece)
            for mono in resampler.resample(None):
                pieces.append(mono.to_ndarray().reshape(-1))
        except (av.error.FFmpegError, ValueError) as exc:
            raise _bad(field, f"could not be decoded ({_reason(exc)})") from exc
    samples = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)
    if samples.size == 0:
        raise _bad(field, "holds no audio that FFmpeg could decode")
    if not np.isfinite(samples).all():
        raise _bad(field, "decodes to NaN or infinite samples")
    return np.clip(samples, -1.0, 1.0), int(rate)


def _claimed_seconds(container: Any, stream: Any) -> float | None:
    """How long the header says the audio is (None when it does not say)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / _TIME_BASE
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split(": '<", 1)[0] if text else type(exc).__name__
