"""The audio toolkit: one way to do each thing omnictl does to audio samples.

- :mod:`omnictl.audio.pcm`: PCM16 ↔ float32 with one rounding rule, and base64 PCM16
  decoding with its checks;
- :mod:`omnictl.audio.resample`: one resampler, with a quality setting, over a whole array or
  a stream of chunks (its state kept between them);
- :mod:`omnictl.audio.wav`: the WAV reader;
- :mod:`omnictl.audio.bounds`: the sample rates taken and the decoded-sample budget.

Every caller in the package uses these (the chat inputs, the speech encoders, the
realtime formats, sessions and VAD, the transcription uploads). How audio streams are
scheduled and played back (the playback clock, the deadline policy, admission) is
:mod:`omnictl.playback`.
"""

from omnictl.audio.bounds import DECODE_SAMPLES_PER_SECOND, MAX_RATE, MIN_RATE, decode_budget
from omnictl.audio.pcm import decode_base64, float_to_pcm16, float_to_pcm16_bytes, pcm16_base64, pcm16_to_float
from omnictl.audio.resample import QUALITIES, FrameResampler, StreamResampler, resample
from omnictl.audio.wav import read_wav

__all__ = [
    "DECODE_SAMPLES_PER_SECOND",
    "FrameResampler",
    "MAX_RATE",
    "MIN_RATE",
    "QUALITIES",
    "decode_base64",
    "decode_budget",
    "float_to_pcm16",
    "float_to_pcm16_bytes",
    "pcm16_base64",
    "pcm16_to_float",
    "read_wav",
    "resample",
    "StreamResampler",
]
