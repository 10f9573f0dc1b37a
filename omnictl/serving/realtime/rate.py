"""One token bucket for every rate a realtime session is held to: the audio a session may
append (seconds of audio, ``Limits.realtime_audio_speed`` x real time after a burst of
``realtime_audio_burst_s``) and the events a WebRTC data channel may carry (events a second)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``burst`` at once, then ``rate`` a second (read from :func:`time.monotonic`)."""

    rate: float
    burst: float
    allowance: float = field(init=False)
    _at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.allowance = self.burst  # starts full

    def take(self, amount: float) -> bool:
        """Whether ``amount`` may be taken now (and, if so, take it)."""
        now = time.monotonic()
        self.allowance = min(self.burst, self.allowance + (now - self._at) * self.rate)
        self._at = now
        if amount > self.allowance:
            return False
        self.allowance -= amount
        return True
