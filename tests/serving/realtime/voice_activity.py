"""A scripted voice-activity source: the one test double at a session's listening boundary.

The session's front end is the real one (the 24 to 16 kHz resampler, Silero's 32 ms frames
and the samples carried between appends, the turn detector with its pause, resume and stop);
only the model that says how likely each frame is speech is replaced. It says 1.0 for a
frame with sound in it and 0.0 for one of silence, so a test's audio is its script:
:func:`voice` where the user talks, :func:`~tests.serving.realtime.speech.silence` where
they do not, and the turns fall where the script puts them (to a frame, 32 ms), with no
Silero, no speech samples and no recogniser. A session takes it where it takes the Silero
model: ``RealtimeSession(..., silero=lambda: ScriptedVoiceActivity())``.
"""

from __future__ import annotations

import numpy as np

from omnictl.inputs import PCM16_RATE

SOUND = 1e-3  # a frame whose loudest sample is over this (of full scale) is speech


class ScriptedVoiceActivity:
    """Duck-types :class:`~omnictl.serving.realtime.vad.SileroModel` (its ``run``)."""

    def __init__(self) -> None:
        self.frames = 0  # frames judged: a test can tell it was this source that heard them
        self.speech = 0  # of which speech

    def run(
        self, frame: np.ndarray, context: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        self.frames += 1
        spoken = frame.size > 0 and float(np.abs(frame).max()) > SOUND
        self.speech += spoken
        return (1.0 if spoken else 0.0), h, c


def voice(ms: int, hz: float = 220.0) -> bytes:
    """``ms`` of "speech" as 24 kHz pcm16: a tone well inside the VAD's 8 kHz band."""
    t = np.arange(int(PCM16_RATE * ms / 1000)) / PCM16_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes()
