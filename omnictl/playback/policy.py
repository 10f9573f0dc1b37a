"""Which audio stream a stage works on next: first come first served, or playback deadline.

Every stage that makes audio for streams (the voice assistant's sentence TTS, the
Qwen3-Omni code2wav vocoder) keeps one :class:`PlaybackDeadlines` and asks it which of
its waiting streams goes next. Under ``deadline`` that is the stream with the least
**slack**: the seconds of audio it has already sent that the listener has left,

    slack = audio sent − time since its first chunk was sent

(negative: the listener is already waiting). A stream that has sent nothing yet has the
deadline of its first chunk instead: its TTFP target after it arrived at the stage,
so a new stream is neither starved by playing ones nor allowed to jump ahead of one about
to run dry. Under ``fifo`` the oldest waiting work goes first, as before.

A stage that knows what its next piece of work costs (the sentence TTS: seconds of
synthesis, from its measured speed) passes ``cost``: a stream is then due when its slack
no longer covers that work (its *laxity*, slack − cost), and a stream not playing yet never
goes ahead of a playing one whose laxity is less than the new one's cost: the new one's
first chunk would make it underrun. Measured on the voice assistant at more arrivals than
the TTS keeps up with, plain least-slack-first gave every new stream its first sentence and
then let all of them starve (median largest underrun 5.8 s against fifo's 0).

Pure bookkeeping on times the caller passes (``time.monotonic()`` in the schedulers), so
it is tested without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, TypeVar

POLICIES = ("fifo", "deadline")
DEFAULT_POLICY = "fifo"
DEFAULT_TTFP_TARGET_S = 1.0  # the first chunk's deadline after a stream arrives at a stage
# A stream holding a batch slot keeps it unless another's deadline comes this much sooner:
# swapping every round between two streams of near-equal slack would only churn the batch.
DEFAULT_SWAP_MARGIN_S = 0.5
# A playing stream is kept from a new one's first chunk while its laxity is under that
# chunk's cost plus this: a cost is a mean, and on a loaded machine one synthesis took
# 1.7 s where its like took 0.5 s (the voice assistant's trace, 12 streams at 0.5/s).
DEFAULT_GUARD_S = 0.5

K = TypeVar("K", bound=Hashable)


def check_policy(policy: str, where: str = "audio_policy") -> str:
    if policy not in POLICIES:
        raise ValueError(f"{where} must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


@dataclass
class _Stream:
    arrived: float
    first_sent: float | None = None
    sent_s: float = 0.0


class PlaybackDeadlines:
    """The playback state of each stream a stage makes audio for, and the policy's choice."""

    def __init__(self, policy: str = DEFAULT_POLICY, ttfp_target_s: float = DEFAULT_TTFP_TARGET_S) -> None:
        self.policy = check_policy(policy)
        if ttfp_target_s < 0:
            raise ValueError(f"ttfp_target_s must be >= 0, got {ttfp_target_s}")
        self.ttfp_target_s = ttfp_target_s
        self._streams: dict[Hashable, _Stream] = {}

    def arrived(self, stream: Hashable, now: float) -> None:
        """``stream`` has work at this stage for the first time (later calls change nothing)."""
        self._streams.setdefault(stream, _Stream(now))

    def sent(self, stream: Hashable, seconds: float, now: float) -> None:
        """``seconds`` of ``stream``'s audio left the stage at ``now``."""
        state = self._streams.setdefault(stream, _Stream(now))
        if seconds <= 0:
            return
        if state.first_sent is None:
            state.first_sent = now
        elif now - state.first_sent > state.sent_s:
            # the listener ran dry and waited: playback restarts from this chunk
            state.first_sent = now - state.sent_s
        state.sent_s += seconds

    def finished(self, stream: Hashable) -> None:
        self._streams.pop(stream, None)

    def slack(self, stream: Hashable, now: float) -> float:
        """Seconds until ``stream``'s listener runs out of audio (before its first chunk:
        until its first chunk's deadline). Unknown streams have no deadline: +inf."""
        state = self._streams.get(stream)
        if state is None:
            return float("inf")
        if state.first_sent is None:
            return state.arrived + self.ttfp_target_s - now
        return state.sent_s - (now - state.first_sent)

    def playing(self, stream: Hashable) -> bool:
        """Whether ``stream`` has sent audio (its listener is playing or has played it)."""
        state = self._streams.get(stream)
        return state is not None and state.first_sent is not None

    def pick(self, waiting: Iterable[K], now: float, cost: Callable[[K], float] | None = None) -> K:
        """The stream to serve next among ``waiting`` (given oldest work first): under
        ``fifo`` the first; under ``deadline`` the least laxity (slack less ``cost``, the
        seconds its next piece of work takes; 0 when not given), the older on a tie, except
        that a new stream does not go ahead of a playing one that cannot afford its cost
        (laxity under it plus :data:`DEFAULT_GUARD_S`)."""
        candidates = list(waiting)
        if not candidates:
            raise ValueError("pick needs at least one waiting stream")
        if self.policy == "fifo":
            return candidates[0]
        costs = {stream: cost(stream) if cost is not None else 0.0 for stream in candidates}
        laxity = {stream: self.slack(stream, now) - costs[stream] for stream in candidates}
        best = min(candidates, key=laxity.__getitem__)  # min keeps the first of equals
        if not self.playing(best):
            at_risk = [s for s in candidates if self.playing(s) and laxity[s] < costs[best] + DEFAULT_GUARD_S]
            if at_risk:
                return min(at_risk, key=laxity.__getitem__)
        return best

    def order(self, waiting: Iterable[K], now: float) -> list[K]:
        """``waiting`` in the order the policy serves them (a batch's priority)."""
        candidates = list(waiting)
        if self.policy == "fifo":
            return candidates
        return sorted(candidates, key=lambda stream: self.slack(stream, now))  # stable: older first on a tie

    def choose(
        self,
        holding: Iterable[K],
        waiting: Iterable[K],
        slots: int,
        now: float,
        may_leave: int | None = None,
        margin_s: float = DEFAULT_SWAP_MARGIN_S,
    ) -> list[K]:
        """Which streams take a round's ``slots`` (a batch's width) when more want one: the
        least slack first, a stream already ``holding`` a slot counting ``margin_s`` less
        (it keeps its slot unless another's deadline is that much sooner). At most
        ``may_leave`` holders lose their slot (None: any). Under ``fifo``: the holders, then
        the waiting in their order, as many as fit."""
        holders = list(holding)
        candidates = [*holders, *waiting]
        if slots <= 0:
            return []
        if self.policy == "fifo" or len(candidates) <= slots:
            return candidates[:slots]
        held = set(holders)

        def key(stream: K) -> float:
            return self.slack(stream, now) - (margin_s if stream in held else 0.0)

        ranked = sorted(candidates, key=key)  # stable: holders first among equals
        chosen = ranked[:slots]
        if may_leave is not None:
            leaving = sorted((s for s in holders if s not in chosen), key=key)
            for stream in leaving[: max(len(leaving) - may_leave, 0)]:
                # too many would leave: the holder nearest starvation stays, in place of the
                # last waiting stream chosen
                newcomers = [s for s in chosen if s not in held]
                if not newcomers:
                    break
                chosen[chosen.index(newcomers[-1])] = stream
        return chosen

    def __len__(self) -> int:
        return len(self._streams)
