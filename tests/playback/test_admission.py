"""Predicting the underrun one more audio stream would cause, from the playing streams' clocks."""

import pytest

from omnictl.playback.admission import predict
from omnictl.playback.continuity import PlaybackClock


def clock(chunks: list[tuple[float, float]]) -> PlaybackClock:
    playing = PlaybackClock(0.0)
    for at, seconds in chunks:
        playing.chunk(at, seconds)
    return playing


def test_a_stream_with_plenty_of_slack_admits_another() -> None:
    # 1 s chunks every 0.2 s: alone or shared by two, far ahead of its listener
    ahead = clock([(0.2 * i, 1.0) for i in range(1, 6)])
    prediction = predict([ahead], now=1.0)
    assert prediction.streams == 1 and prediction.underrun_s == 0


def test_a_stream_just_keeping_up_would_underrun_if_shared() -> None:
    # 0.5 s chunks every 0.5 s: in real time exactly; two streams would halve its pace
    tight = clock([(0.5 * i, 0.5) for i in range(1, 5)])  # the last at 2.0 plays until 2.5
    prediction = predict([tight], now=2.1)
    # next chunk predicted at 2.0 + 0.5 * 2 = 3.0, the audio runs out at 2.5
    assert prediction.underrun_s == pytest.approx(0.5)
    assert prediction.retry_after_s == pytest.approx(0.4 + 0.5)


def test_one_chunk_so_far_is_paced_by_the_time_it_took() -> None:
    # 2 s to make 3 s of audio: shared by two, the next would take 4 s and come 1 s late
    first = clock([(2.0, 3.0)])
    assert predict([first], now=2.5).underrun_s == pytest.approx(1.0)
    assert predict([clock([(0.5, 3.0)])], now=1.0).underrun_s == 0  # 0.5 s for 3 s: plenty


def test_streams_not_playing_yet_count_but_predict_nothing() -> None:
    waiting = PlaybackClock(0.0)
    one_chunk = clock([(0.3, 1.0)])
    tight = clock([(0.5 * i, 0.5) for i in range(1, 5)])
    prediction = predict([waiting, one_chunk, tight], now=2.0)
    assert prediction.streams == 3
    # three open: one more stretches the intervals by 4/3: 2.0 + 0.5 * 4/3 - 2.5
    assert prediction.underrun_s == pytest.approx(0.5 * 4 / 3 - 0.5)
    assert predict([], now=0.0).underrun_s == 0
