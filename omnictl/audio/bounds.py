"""What audio from a client may be: its sample rate and how much decoding it may cost."""

from __future__ import annotations

MIN_RATE, MAX_RATE = 1000, 384_000  # input audio sample rates accepted (Hz)
# Decoded samples (every channel counted) allowed per second of the duration limit:
# stereo at 48 kHz. A file at 384 kHz, or in many channels, is refused for the work it
# would take (see decode_budget), not only for its length.
DECODE_SAMPLES_PER_SECOND = 2 * 48_000


def decode_budget(max_seconds: float) -> int:
    """How many decoded samples (all channels counted) one audio input under a duration
    limit of ``max_seconds`` may take to decode: that long in stereo at 48 kHz."""
    return int(max_seconds * DECODE_SAMPLES_PER_SECOND)


# Packets (FFmpeg's demuxed units, every stream's counted) allowed per second of audio
# decoded: 1 ms of audio a packet on average. The most packets a second among codecs in
# use: Apple's IMA ADPCM in CAF (64 samples a packet: 689 at 44.1 kHz, 750 at 48 kHz;
# above 64 kHz it would be refused), Opus's 2.5 ms frames (400); AAC is ~47 a second,
# mp3 ~38, AMR and WebRTC's Opus 50, Vorbis of nothing but short blocks ~375 at 48 kHz,
# PCM in Matroska or WebM ~100 (10 ms blocks). Each packet costs the decode loop Python objects and time whatever it holds,
# so a file of one-sample packets (2 MB of Matroska lacing holds 1.92 million) costs
# hundreds of times the decoding its length would: the limit is on what the file costs,
# not on what it decodes to. A file may use PACKETS_PER_SECOND more than that, for its
# headers, a decoder's delay and a short file's first second.
PACKETS_PER_SECOND = 1_000


def packet_allowance(audio_seconds: float) -> int:
    """How many packets a file may have demuxed once ``audio_seconds`` of its audio are
    decoded: :data:`PACKETS_PER_SECOND` for each second, and as many again."""
    return int(PACKETS_PER_SECOND * (audio_seconds + 1))
