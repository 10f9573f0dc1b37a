"""FAN-IN: hold a request's partial inputs until every expected upstream has arrived.

Expected upstreams are the stage's upstreams that run for this request (modality
pruning) minus those a route_fn left out (announced by a Skip message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class _Partial:
    expected: set[str]
    arrived: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FanInResult:
    """``ready`` with the merged input, ``skipped`` when no upstream will come, else wait."""

    ready: bool = False
    skipped: bool = False
    data: Any = None


WAIT = FanInResult()
SKIPPED = FanInResult(skipped=True)


class FanIn:
    def __init__(self, upstreams: tuple[str, ...], merge: Callable[[dict[str, Any]], Any] | None) -> None:
        self.upstreams = upstreams
        self.merge = merge
        self._partials: dict[str, _Partial] = {}

    def __len__(self) -> int:
        return len(self._partials)

    def _partial(self, request_id: str, active: tuple[str, ...]) -> _Partial:
        partial = self._partials.get(request_id)
        if partial is None:
            expected = {u for u in self.upstreams if u in active}
            partial = self._partials[request_id] = _Partial(expected)
        return partial

    def arrive(self, request_id: str, active: tuple[str, ...], source: str | None, data: Any) -> FanInResult:
        """Record ``source``'s input. Raises what ``merge_fn`` raises."""
        if self.merge is None:  # a single upstream (or the entry): nothing to wait for
            return FanInResult(ready=True, data=data)
        partial = self._partial(request_id, active)
        partial.arrived[source or ""] = data
        return self._check(request_id, partial)

    def skip(self, request_id: str, active: tuple[str, ...], source: str) -> FanInResult:
        if self.merge is None:
            return SKIPPED
        partial = self._partial(request_id, active)
        partial.expected.discard(source)
        return self._check(request_id, partial)

    def _check(self, request_id: str, partial: _Partial) -> FanInResult:
        if not partial.expected.issubset(partial.arrived):
            return WAIT
        del self._partials[request_id]
        if not partial.arrived:
            return SKIPPED
        assert self.merge is not None
        return FanInResult(ready=True, data=self.merge(partial.arrived))

    def waiting(self, request_id: str) -> bool:
        return request_id in self._partials

    def drop(self, request_id: str) -> None:
        self._partials.pop(request_id, None)
