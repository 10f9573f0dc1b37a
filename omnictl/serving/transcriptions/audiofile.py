"""An uploaded audio file (``/v1/audio/transcriptions`` and ``/translations``) → float32 mono.

The upload is untrusted, so FFmpeg (through PyAV) only ever sees it as audio of one
container format chosen here from the file's own first bytes (:func:`sniff_format`):
FFmpeg never probes, so no text file is taken for a concat list, an HLS or SDP
playlist or an image sequence (demuxers that open other files or sockets), and no
protocol is allowed for anything the file might name. WAV is read by
:func:`omnictl.audio.read_wav` (the same reader as chat's input audio); the others are
the formats browsers and phones record: mp3, AAC (ADTS or in mp4/m4a), Ogg (Opus,
Vorbis, FLAC), WebM/Matroska, FLAC, CAF, AIFF, AMR.

The work is bounded before it is done: the duration limit and the decoded-sample budget
(:func:`decode_budget`: ``max_seconds`` of stereo at 48 kHz; every channel of every
frame counts) are checked against what the container's header claims, before a single
frame is decoded, and again against what decoding produces, stopping as soon as either
is over (a header may lie the other way). Audio above 48 kHz comes out at 48 kHz (FFmpeg's
resampler, while decoding), so nothing downstream resamples hundreds of kHz. A caller
that gives up (the client hung up) sets ``cancel`` and the decode stops at the next packet.

What the file costs is bounded too, not only what it decodes to: every packet the
demuxer hands over (of any stream) costs the loop its Python objects and time, however
little audio it holds, so a file may have at most
:data:`~omnictl.audio.bounds.PACKETS_PER_SECOND` packets per second of audio decoded so
far (:func:`~omnictl.audio.bounds.packet_allowance`), checked at each packet: 2 MB of
Matroska holding 40 s of 8-bit PCM in 1.92 million one-sample packets is refused after
~1,000 packets. The decoded audio goes into one buffer of the most samples the duration
limit allows (untouched pages cost no memory), not a list of per-frame arrays.
Error messages never carry FFmpeg's own text (which, for a file naming another, said
whether that one existed).
"""

from __future__ import annotations

import io
import logging
import threading
from typing import Any

import numpy as np

from omnictl.audio import MAX_RATE, MIN_RATE, FrameResampler, decode_budget, read_wav, resample
from omnictl.audio.bounds import PACKETS_PER_SECOND, packet_allowance
from omnictl.exceptions import DecodeCancelled, InvalidRequest, PayloadTooLarge

log = logging.getLogger(__name__)

_TIME_BASE = 1_000_000  # FFmpeg's AV_TIME_BASE: container durations are in microseconds
OUTPUT_MAX_RATE = 48_000  # decoded audio above this rate is resampled down to it while decoding
FORMATS = ("wav", "mp3", "aac", "mp4/m4a", "ogg", "webm/matroska", "flac", "caf", "aiff", "amr")
# FFmpeg's options for every upload: no protocol at all (the upload is handed over as
# bytes; nothing it names may be opened), and mp4/mov's external data references off.
_OPEN_OPTIONS = {"protocol_whitelist": "none", "enable_drefs": "0", "use_absolute_path": "0"}
_CHUNK = 16_384  # decoded samples (per channel) handed to the resampler at once


def _bad(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"'{field}' {problem}", field=field)


def _too_long(field: str, seconds: float, limit: float, claimed: bool) -> PayloadTooLarge:
    what = "its header says it lasts" if claimed else "it lasts over"
    return PayloadTooLarge(f"'{field}' is too long: {what} {seconds:.0f} s; the limit is {limit:g} s", field=field)


def _over_budget(field: str, what: str, budget: int, max_seconds: float) -> InvalidRequest:
    return _bad(
        field,
        f"is too much audio to decode: {what}; the limit is {budget:,} decoded samples "
        f"({max_seconds:g} s of stereo at 48 kHz, all channels counted)",
    )


def _too_many(field: str, what: str, count: int, seconds: float) -> InvalidRequest:
    return _bad(
        field,
        f"has too many {what} for its audio: {count:,} {what} hold {seconds:.3f} s; the limit is "
        f"{PACKETS_PER_SECOND:,} {what} per second of audio (and {PACKETS_PER_SECOND:,} more), "
        "which no audio codec in use needs",
    )


def sniff_format(data: bytes) -> str | None:
    """The FFmpeg demuxer for ``data``, chosen by its first bytes; None when it is none of
    the audio formats taken (:data:`FORMATS`)."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: WebM and Matroska
        return "matroska"
    if head[4:8] == b"ftyp":  # ISO base media: mp4, m4a, 3gp
        return "mov"
    if head[:4] == b"caff":
        return "caf"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:5] == b"#!AMR":
        return "amr"
    if head[:3] == b"ID3":
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame sync
        return "aac" if head[1] & 0x06 == 0 else "mp3"  # layer bits 00: an ADTS (AAC) header
    return None


def decode_audio_file(
    data: bytes, field: str, max_seconds: float, cancel: threading.Event | None = None
) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate; InvalidRequest naming ``field`` for a file
    that is not one of :data:`FORMATS`, cannot be decoded, holds no audio or is over the
    decoded-sample budget; PayloadTooLarge for one over ``max_seconds``; :class:`~omnictl.exceptions.DecodeCancelled`
    once ``cancel`` is set."""
    if not data:
        raise _bad(field, "is empty")
    fmt = sniff_format(data)
    if fmt is None:
        raise _bad(field, f"is not an audio file of a format taken here ({', '.join(FORMATS)})")
    budget = decode_budget(max_seconds)
    if fmt == "wav":
        samples, rate = read_wav(data, field, max_samples=budget)
        if samples.size == 0:
            raise _bad(field, "holds no audio")
        if samples.size / rate > max_seconds:
            raise _too_long(field, samples.size / rate, max_seconds, claimed=False)
        if rate > OUTPUT_MAX_RATE:
            samples, rate = resample(samples, rate, OUTPUT_MAX_RATE), OUTPUT_MAX_RATE
        return samples, rate
    return _decode_with_ffmpeg(data, fmt, field, max_seconds, budget, cancel or threading.Event())


def _decode_with_ffmpeg(
    data: bytes, fmt: str, field: str, max_seconds: float, budget: int, cancel: threading.Event
) -> tuple[np.ndarray, int]:
    import av  # PyAV: FFmpeg's demuxers and decoders, in its wheel

    try:
        container: Any = av.open(io.BytesIO(data), mode="r", format=fmt, options=_OPEN_OPTIONS)
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        log.debug("FFmpeg could not open an upload as %s: %s", fmt, exc)  # the 400 says why; this says FFmpeg's words
        raise _bad(field, f"could not be read as {_named(fmt)} audio (damaged, or not that format)") from None
    with container:
        if not container.streams.audio:
            raise _bad(field, "has no audio stream")
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate or stream.rate
        if not rate or not MIN_RATE <= rate <= MAX_RATE:
            raise _bad(field, f"has a sample rate of {rate} Hz; it must be between {MIN_RATE} and {MAX_RATE} Hz")
        channels = max(1, stream.codec_context.channels or 1)
        claimed = _claimed_seconds(container, stream)
        if claimed is not None and claimed > max_seconds:
            raise _too_long(field, claimed, max_seconds, claimed=True)
        if claimed is not None and claimed * rate * channels > budget:
            what = f"its header says {claimed:.1f} s at {rate} Hz in {channels} channel(s)"
            raise _over_budget(field, what, budget, max_seconds)
        out_rate = min(int(rate), OUTPUT_MAX_RATE)
        # Decoded frames come in the codec's own layout (planar, several channels): one
        # resampler turns them into float mono, at most 48 kHz. It costs ~100 µs a call
        # whatever the frame holds, so frames are gathered into chunks for it (a FIFO
        # of the codec's format; one that changes format mid-stream fails either way).
        resampler = FrameResampler(out_rate)
        fifo = av.AudioFifo()
        # One buffer for the most the duration limit lets through (600 s at 48 kHz: 115 MB
        # of address space, but only the pages written to become memory), filled in
        # place: a list of per-frame arrays cost ~250 bytes a frame, whatever it held.
        out = np.empty(int(max_seconds * out_rate) + 1, dtype=np.float32)
        total, decoded, packets, frames, seconds = 0, 0, 0, 0, 0.0
        try:
            # Every stream's packets are demuxed and counted (the others are dropped
            # undecoded): a stream beside the audio costs the loop as much.
            for packet in container.demux():
                if cancel.is_set():
                    raise DecodeCancelled(field)
                packets += 1
                if packets > packet_allowance(seconds):
                    raise _too_many(field, "packets", packets, seconds)
                if packet.stream.index != stream.index:
                    continue
                for frame in packet.decode():
                    frames += 1  # one packet may decode to several frames
                    if frames > packet_allowance(seconds):
                        raise _too_many(field, "frames", frames, seconds)
                    decoded += frame.samples * max(1, len(frame.layout.channels))
                    if decoded > budget:  # a frame's rate or channels may differ from the header's
                        raise _over_budget(field, f"it decodes to over {decoded:,} samples", budget, max_seconds)
                    if not frame.samples:
                        continue
                    seconds += frame.samples / (frame.sample_rate or rate)
                    frame.pts = None  # the FIFO refuses timestamps that do not follow on; they are not ours to check
                    fifo.write(frame)
                    if fifo.samples >= _CHUNK:
                        total = _put(out, total, resampler.push(fifo.read()), field, max_seconds, out_rate)
            if fifo.samples:
                total = _put(out, total, resampler.push(fifo.read()), field, max_seconds, out_rate)
            total = _put(out, total, resampler.flush(), field, max_seconds, out_rate)
        except (av.error.FFmpegError, ValueError) as exc:
            log.debug("FFmpeg could not decode an upload (%s): %s", fmt, exc)
            raise _bad(field, f"could not be decoded as {_named(fmt)} audio (damaged)") from None
    samples = out[:total]
    if samples.size == 0:
        raise _bad(field, "holds no audio that FFmpeg could decode")
    if not np.isfinite(samples).all():
        raise _bad(field, "decodes to NaN or infinite samples")
    # A new array of the samples alone: the buffer (and its address space) goes with it.
    return np.clip(samples, -1.0, 1.0), out_rate


def _put(out: np.ndarray, total: int, piece: np.ndarray, field: str, max_seconds: float, rate: int) -> int:
    """``piece`` written into ``out`` after its first ``total`` samples; the new total.
    PayloadTooLarge when it does not fit: ``out`` holds the duration limit's worth."""
    end = total + piece.size
    if end > out.size:
        raise _too_long(field, end / rate, max_seconds, claimed=False)
    out[total:end] = piece
    return end


def _named(fmt: str) -> str:
    return {"mov": "mp4/m4a", "matroska": "webm/matroska", "aac": "AAC"}.get(fmt, fmt)


def _claimed_seconds(container: Any, stream: Any) -> float | None:
    """How long the header says the audio is (None when it does not say)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / _TIME_BASE
    return None
