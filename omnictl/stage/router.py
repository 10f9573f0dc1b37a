"""ROUTE: decide which downstream stages get a result, and what each of them gets."""

from __future__ import annotations

from typing import Any, Callable

from omnictl.exceptions import RouteContractError
from omnictl.topology.model import StageSpec
from omnictl.transports.packing import copy_containers

__all__ = ["RouteContractError", "Router"]  # RouteContractError: defined in omnictl.exceptions


class Router:
    def __init__(
        self,
        spec: StageSpec,
        route_fn: Callable[[Any], Any] | None,
        projections: dict[str, Callable[[Any], Any]],
    ) -> None:
        self.spec = spec
        self.route_fn = route_fn
        self.projections = projections

    def targets(self, data: Any, active: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """(targets to send to, candidates left out) among the stages active for the request."""
        candidates = [t for t in self.spec.next if t in active]
        if self.route_fn is None:
            return candidates, []
        chosen = self._checked(self.route_fn(data))
        return [t for t in candidates if t in chosen], [t for t in candidates if t not in chosen]

    def _checked(self, value: Any) -> set[str]:
        declared = self.spec.next
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple, set, frozenset)) or not names:
            raise RouteContractError(
                f"route_fn of stage {self.spec.name!r} returned {value!r}; "
                f"it must return one or more of {list(declared)}"
            )
        undeclared = [n for n in names if n not in declared]
        if undeclared:
            raise RouteContractError(
                f"route_fn of stage {self.spec.name!r} returned {value!r}: "
                f"{undeclared} not declared in its `next` {list(declared)}"
            )
        return set(names)

    def payload_for(self, target: str, data: Any, fan_out: bool) -> Any:
        """What ``target`` receives: its projection, or (on fan-out) its own containers."""
        projection = self.projections.get(target)
        if projection is not None:
            return projection(copy_containers(data) if fan_out else data)
        return copy_containers(data) if fan_out else data
