"""The playback clock on synthetic chunk timings whose underruns are known by hand."""

import pytest

from omnictl.playback.continuity import PlaybackClock


def feed(timings: list[tuple[float, float]], start: float = 0.0) -> PlaybackClock:
    clock = PlaybackClock(start)
    for at, seconds in timings:
        clock.chunk(at, seconds)
    return clock


def test_chunks_faster_than_real_time_never_underrun() -> None:
    # first chunk at 0.2 s, then one 0.5 s chunk every 0.4 s: always ahead of the listener
    report = feed([(0.2 + 0.4 * i, 0.5) for i in range(5)]).report()
    assert report.ttfp_s == pytest.approx(0.2)
    assert report.chunks == 5 and report.audio_s == pytest.approx(2.5)
    assert report.largest_underrun_s == 0 and report.total_underrun_s == 0
    assert report.gaps_over == {50: 0, 100: 0, 250: 0}
    assert report.intervals_s == pytest.approx((0.4, 0.4, 0.4, 0.4))
    assert report.rtf == pytest.approx(1.8 / 2.5)  # the last chunk left at 1.8 s
    assert report.underruns == ()


def test_one_300_ms_gap() -> None:
    # 1 s of audio at t=1.0 runs out at 2.0; the next chunk comes at 2.3: one 300 ms gap
    clock = feed([(1.0, 1.0), (2.3, 1.0), (3.0, 0.5)], start=0.5)
    report = clock.report()
    assert report.ttfp_s == pytest.approx(0.5)
    assert report.largest_underrun_s == pytest.approx(0.3)
    assert report.total_underrun_s == pytest.approx(0.3)
    assert report.gaps_over == {50: 1, 100: 1, 250: 1}
    (gap,) = report.underruns
    assert gap.at == pytest.approx(2.0) and gap.chunk == 1
    # playback restarted at 2.3: 2.3 + 1.0 runs to 3.3, so the chunk at 3.0 is in time
    assert clock.slack(3.0) == pytest.approx(0.8)
    assert report.intervals_s == pytest.approx((1.3, 0.7))


def test_many_small_gaps_add_up() -> None:
    # 0.1 s chunks every 0.16 s: each one 60 ms late, 9 gaps of 60 ms after the first chunk
    clock = feed([(0.16 * i, 0.1) for i in range(10)])
    report = clock.report()
    assert len(report.underruns) == 9
    assert report.largest_underrun_s == pytest.approx(0.06)
    assert report.total_underrun_s == pytest.approx(0.54)
    assert report.gaps_over == {50: 9, 100: 0, 250: 0}
    assert report.rtf == pytest.approx(0.16 * 9 / 1.0)


def test_slack_before_and_while_playing() -> None:
    clock = PlaybackClock(0.0)
    assert clock.slack(5.0) == 0.0  # nothing is playing yet
    assert clock.chunk(1.0, 2.0) == 0.0
    assert clock.slack(1.5) == pytest.approx(1.5)
    assert clock.slack(3.25) == pytest.approx(-0.25)  # the listener has waited 250 ms
    assert clock.chunk(3.25, 1.0) == pytest.approx(0.25)


def test_an_empty_chunk_is_not_a_chunk_and_time_cannot_go_back() -> None:
    clock = feed([(1.0, 0.5), (1.2, 0.0)])
    assert clock.report().chunks == 1
    with pytest.raises(ValueError, match="must not go back"):
        clock.chunk(0.5, 0.1)
    with pytest.raises(ValueError, match=">= 0 seconds"):
        clock.chunk(2.0, -1.0)
    assert PlaybackClock(0.0).report().ttfp_s is None
