"""The one token bucket of the realtime server (a session's audio rate, a data channel's events)."""

from __future__ import annotations

import pytest

import omnictl.serving.realtime.rate as rate_module
from omnictl.serving.realtime.rate import TokenBucket


def test_a_bucket_gives_its_burst_then_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(rate_module.time, "monotonic", lambda: now[0])
    bucket = TokenBucket(rate=2.0, burst=1.0)
    bucket._at = 0.0  # its clock starts at the patched zero
    assert bucket.take(0.6) and not bucket.take(0.5)
    now[0] = 0.1  # 0.2 back
    assert bucket.take(0.6) and bucket.allowance == pytest.approx(0.0)
    now[0] = 100.0  # never more than the burst
    assert bucket.take(1.0) and not bucket.take(0.01)
