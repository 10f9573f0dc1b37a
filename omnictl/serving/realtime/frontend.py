"""One realtime session's audio front end: what its microphone's audio goes through before
the session decides anything, every piece of state kept from one append to the next.

- :class:`AudioFrontEnd` decodes what the client appends in the session's input format
  (pcm16 at 24 kHz as is; G.711 at 8 kHz through one streaming resampler kept per format, not
  a new one per chunk) to the pcm16 at 24 kHz the session buffers.
- :class:`SpeechFrontEnd` hears that audio for turn detection: one stateful 24 to 16 kHz
  resampler (:class:`~omnictl.audio.resample.StreamResampler`), then Silero VAD's 32 ms
  frames (:class:`~omnictl.serving.realtime.vad.SileroVad`, which carries the samples short of
  a frame to the next append) and the turn detector (server VAD, or the semantic one, which
  hears the same 16 kHz audio).

Each append used to be resampled on its own: every chunk edge was filtered against zeros and
its length rounded, so 1,001-sample appends gave 31,984 of 32,000 samples over 2 s (the VAD's
clock drifted ~0.3 s per 10 minutes) and one-sample appends gave one 16 kHz sample each (1.5x
on the clock, and never speech). Here the 16 kHz stream is the same whatever sizes the appends
had: ``N`` samples at 24 kHz are ``2N/3`` at 16 kHz, less under a millisecond the filter
waits for.
"""

from __future__ import annotations

import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.audio.resample import StreamResampler
from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime.formats import PCM, AudioCodec, Pcm16Decoder
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector
from omnictl.serving.realtime.vad import VAD_RATE, SileroModel, SileroVad, TurnDetector, TurnEvent


class SpeechFrontEnd:
    """Turn detection over a session's pcm16 at 24 kHz, appended in pieces of any size.

    Not thread-safe: the session hands it one piece at a time (in the VAD worker thread) and
    waits for the answer before the next.
    """

    def __init__(self, model: SileroModel, turns: TurnDetector | SemanticTurnDetector) -> None:
        # "fast": the 33-tap low-pass and exact 3:2 decimation the VAD was tuned on, now with
        # its history carried across appends
        self._resampler = StreamResampler(PCM16_RATE, VAD_RATE, "fast")
        self.vad = SileroVad(model, VAD_RATE)
        self.turns = turns

    @property
    def heard_ms(self) -> float:
        """How much audio (ms at 16 kHz) has reached the VAD: its timeline."""
        return self._resampler.given * 1000 / VAD_RATE

    def hear(self, raw: bytes) -> tuple[np.ndarray, list[TurnEvent]]:
        """pcm16 at 24 kHz: (the 16 kHz audio it completes, the turn events it brings)."""
        audio = self._resampler.push(pcm16_to_float(raw))
        probabilities = self.vad.feed(audio)
        if isinstance(self.turns, SemanticTurnDetector):  # the turn model hears the same audio
            return audio, self.turns.feed(probabilities, audio)
        return audio, self.turns.feed(probabilities)


class AudioFrontEnd:
    """A session's input audio: the client's format decoded to pcm16 at 24 kHz by one stateful
    decoder per format, and the session's :class:`SpeechFrontEnd` (None without turn detection),
    made anew by :meth:`listen` when the buffer is cleared or the turn detection changes."""

    def __init__(self) -> None:
        self.speech: SpeechFrontEnd | None = None
        self._decoder: Pcm16Decoder = PCM.decoder()

    def listen(self, speech: SpeechFrontEnd | None) -> None:
        self.speech = speech

    def to_pcm16(self, codec: AudioCodec, raw: bytes) -> bytes:
        """``raw`` in ``codec`` as pcm16 at 24 kHz, continuing the stream of that format (a new
        stream when the session's input format changed)."""
        if self._decoder.codec is not codec:
            self._decoder = codec.decoder()
        return self._decoder.decode(raw)
