"""Which tensor-parallel rank this process is, while its stage's factory runs.

The stage's tensor-parallel group (:mod:`omnictl.stage.tp_group`, :mod:`omnictl.stage.tp_follower`)
marks the rank with :func:`building`; a model's loader reads it with :func:`current` (see
:mod:`omnictl.models.tensor_parallel`, which re-exports both).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass
class RankInfo:
    stage: str
    rank: int
    size: int
    device: str  # "cpu" or "cuda:N": where this rank's shard lives
    join: Callable[[], None] | None = None  # rank 0: start the followers and join them (once)
    joined: bool = False  # a model was sharded over the group
    engine: bool = False  # an engine runs the ranks itself

    def join_group(self) -> None:
        if not self.joined and self.join is not None:
            self.join()
        self.joined = True


_current: RankInfo | None = None


def current() -> RankInfo | None:
    """The rank being built now (None: not in a tensor-parallel group)."""
    return _current


@contextmanager
def building(info: RankInfo) -> Iterator[None]:
    """Mark this process as rank ``info.rank`` while its stage's factory runs."""
    global _current
    previous, _current = _current, info
    try:
        yield
    finally:
        _current = previous
