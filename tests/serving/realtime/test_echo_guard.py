"""The echo guard's judgement on real speech: the answer's own audio coming back (delayed,
attenuated) is echo; another voice over that echo is not."""

from __future__ import annotations

import numpy as np

from benchmarks.eval.samples import sample_question
from omnictl.inputs import resample
from omnictl.serving.realtime.echo_guard import ECHO_SHARE, EchoGuard
from omnictl.serving.realtime.vad import VAD_RATE


def _speech(name: str) -> np.ndarray:
    samples, rate = sample_question(name)
    return resample(samples.astype(np.float32), rate, VAD_RATE)


def _played(answer: np.ndarray, now: float) -> EchoGuard:
    """A guard that sent ``answer`` in 100 ms deltas, the first 2 s before ``now``."""
    guard = EchoGuard()
    step = VAD_RATE // 10
    for start in range(0, answer.size, step):  # sent at once, faster than played: queued one after another
        guard.sent(answer[start : start + step], now=now - 2.0)
    return guard


def test_the_answers_own_voice_coming_back_is_echo_and_another_voice_is_not() -> None:
    now = 100.0
    answer = _speech("largest_planet")  # what the assistant said, from now - 2 s on
    delay = int(0.25 * VAD_RATE)  # the echo comes back 250 ms late, at a third of the level
    heard_from = int(1.2 * VAD_RATE)  # the last 400 ms up to now: 1.6 s to 2.0 s of played audio
    echo = 0.33 * answer[heard_from - delay : heard_from - delay + int(0.4 * VAD_RATE)]
    guard = _played(answer, now)
    guard.heard(np.concatenate([np.zeros(VAD_RATE // 2, np.float32), echo]))
    assert guard.playing(now) and guard.echo_share(400) >= 0.9
    other = 0.6 * _speech("sky_colour")[int(0.4 * VAD_RATE) : int(0.8 * VAD_RATE)]
    guard.heard(echo + other)  # a different voice over the same echo
    assert guard.echo_share(400) < ECHO_SHARE, guard.judged
    guard.heard(0.6 * _speech("sky_colour")[int(0.8 * VAD_RATE) : int(1.2 * VAD_RATE)])
    assert guard.echo_share(400) < 0.2  # a voice alone: the played audio explains nothing of it
    guard.stop(now)
    assert not guard.playing(now + 1.5)  # stopped: no echo to expect after the tail


def test_an_empty_chunk_sent_or_heard_changes_nothing() -> None:
    # An answer's clause with nothing to pronounce is 0 samples; it plays for no time.
    guard = EchoGuard()
    guard.sent(np.zeros(0, np.float32), now=10.0)
    guard.heard(np.zeros(0, np.float32))
    assert not guard.playing(10.0) and guard.echo_share(400) == 0.0
    guard.sent(np.ones(VAD_RATE, np.float32), now=10.0)  # one second, playing from 10 s
    guard.sent(np.zeros(0, np.float32), now=20.0)  # long after it ended: still nothing plays
    assert not guard.playing(20.0)
