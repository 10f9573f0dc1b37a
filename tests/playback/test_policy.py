"""The playback-deadline policy: slack from sent audio, the first chunk's deadline, FIFO kept."""

import pytest

from omnictl.playback.policy import PlaybackDeadlines


def test_the_stream_with_less_slack_is_served_first() -> None:
    policy = PlaybackDeadlines("deadline")
    policy.arrived("a", 0.0)
    policy.arrived("b", 0.0)
    policy.sent("a", 3.0, now=1.0)  # a: 3 s of audio from t=1
    policy.sent("b", 1.0, now=1.0)  # b: 1 s of audio from t=1
    assert policy.slack("a", 1.5) == pytest.approx(2.5)
    assert policy.slack("b", 1.5) == pytest.approx(0.5)
    assert policy.pick(["a", "b"], now=1.5) == "b"  # b runs dry first, though a waited longer
    assert policy.order(["a", "b"], now=1.5) == ["b", "a"]
    # FIFO keeps arrival order whatever the slack
    fifo = PlaybackDeadlines("fifo")
    for stream, seconds in (("a", 3.0), ("b", 1.0)):
        fifo.sent(stream, seconds, now=1.0)
    assert fifo.pick(["a", "b"], now=1.5) == "a" and fifo.order(["a", "b"], 1.5) == ["a", "b"]


def test_a_new_stream_has_its_first_chunks_deadline() -> None:
    policy = PlaybackDeadlines("deadline", ttfp_target_s=0.5)
    policy.sent("playing", 2.0, now=0.0)  # runs dry at 2.0
    policy.arrived("new", 1.0)  # its first chunk is due at 1.5
    assert policy.slack("new", 1.2) == pytest.approx(0.3)
    assert policy.slack("playing", 1.2) == pytest.approx(0.8)
    assert policy.pick(["playing", "new"], now=1.2) == "new"
    # once the new stream has a few seconds queued for its listener, the playing one goes first
    policy.sent("new", 2.2, now=1.45)
    assert policy.slack("new", 1.6) == pytest.approx(2.05)
    assert policy.pick(["new", "playing"], now=1.6) == "playing"


def test_playback_restarts_after_the_listener_waited() -> None:
    policy = PlaybackDeadlines("deadline")
    policy.sent("s", 1.0, now=0.0)  # runs out at 1.0
    policy.sent("s", 1.0, now=1.5)  # 0.5 s late: the listener heard 1 s, waited, and plays again from 1.5
    assert policy.slack("s", 1.5) == pytest.approx(1.0)
    assert policy.slack("s", 2.0) == pytest.approx(0.5)


def test_unknown_streams_bad_policies_and_the_finished() -> None:
    policy = PlaybackDeadlines("deadline")
    assert policy.slack("nobody", 0.0) == float("inf")
    policy.arrived("x", 0.0)
    policy.finished("x")
    assert len(policy) == 0
    with pytest.raises(ValueError, match="fifo, deadline"):
        PlaybackDeadlines("edf")
    with pytest.raises(ValueError, match="at least one"):
        policy.pick([], 0.0)


def test_a_rounds_slots_go_to_the_streams_nearest_starvation() -> None:
    policy = PlaybackDeadlines("deadline", ttfp_target_s=1.0)
    policy.sent("ahead", 10.0, now=0.0)  # 10 s in hand
    policy.sent("tight", 0.6, now=0.0)
    policy.arrived("new", 0.0)  # its first chunk due at 1.0
    # one slot: the new stream's deadline is sooner than the far-ahead holder's by more than the margin
    assert policy.choose(["ahead"], ["new"], slots=1, now=0.2) == ["new"]
    # two slots, three streams: the one with 10 s in hand sits the round out
    assert policy.choose(["ahead", "tight"], ["new"], slots=2, now=0.2) == ["tight", "new"]
    # a holder keeps its slot against a stream only a little more urgent (the margin)
    policy.sent("close", 1.2, now=0.0)  # 1.0 s left at 0.2: later than the new one's 0.8 s, by less than 0.5 s
    assert policy.choose(["close"], ["new"], slots=1, now=0.2) == ["close"]
    # no holder leaves when none may: the waiting stream is not taken
    assert policy.choose(["ahead"], ["new"], slots=1, now=0.2, may_leave=0) == ["ahead"]
    # everything fits: all of them, whatever their slack
    assert policy.choose(["ahead"], ["new"], slots=2, now=0.2) == ["ahead", "new"]
    # fifo: the holders keep their slots, the waiting in order as room allows
    fifo = PlaybackDeadlines("fifo")
    assert fifo.choose(["ahead"], ["new", "later"], slots=2, now=0.2) == ["ahead", "new"]


def test_with_costs_a_stream_is_due_when_its_slack_no_longer_covers_its_work() -> None:
    policy = PlaybackDeadlines("deadline")
    policy.sent("short", 1.0, now=0.0)  # 1 s left at 0, its next sentence takes 0.2 s: laxity 0.8
    policy.sent("long", 1.5, now=0.0)  # 1.5 s left, its next takes 1.0 s: laxity 0.5
    costs = {"short": 0.2, "long": 1.0}
    assert policy.pick(["short", "long"], now=0.0) == "short"  # by slack alone
    assert policy.pick(["short", "long"], now=0.0, cost=costs.__getitem__) == "long"


def test_a_new_stream_does_not_go_ahead_of_a_playing_one_it_would_make_underrun() -> None:
    policy = PlaybackDeadlines("deadline", ttfp_target_s=1.0)
    policy.sent("playing", 2.0, now=0.0)
    policy.arrived("new", 0.0)
    assert policy.playing("playing") and not policy.playing("new")
    # at 0.5: the playing one has 1.5 s left and its next sentence takes 0.1 s (laxity 1.4),
    # the new one is due at 1.0 and takes 0.3 s (laxity 0.2): the new one goes first, as
    # the playing one can spare its 0.3 s and the guard
    assert policy.pick(["playing", "new"], now=0.5, cost={"playing": 0.1, "new": 0.3}.__getitem__) == "new"
    # a 1.0 s first sentence (plus the 0.5 s guard) would outlast its 1.4 s: the playing one first
    assert policy.pick(["playing", "new"], now=0.5, cost={"playing": 0.1, "new": 1.0}.__getitem__) == "playing"
