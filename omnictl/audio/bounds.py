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
