"""Dotted paths that name something other than a stage callable from a user or omnictl module.

A topology names callables by dotted path and the runtime calls them: ``factory:
os.system`` with ``factory_args: {command: ...}`` runs a shell command, ``builtins.eval``
evaluates one. Such a topology is valid (it names a callable), so ``validate`` says so,
with a warning naming the stage and the path: a topology file is code, to be trusted as such.
"""

from __future__ import annotations

import sys

from omnictl.topology.model import Topology

# The standard library and the interpreter's own: never where a stage callable lives.
_SYSTEM = frozenset(sys.stdlib_module_names) | {"builtins", "__builtin__", "__main__"}


def system_module(dotted: str) -> str | None:
    """The top-level module of ``dotted`` when it is the standard library's, else None."""
    top = dotted.split(":", 1)[0].split(".", 1)[0]
    return top if top in _SYSTEM else None


def unexpected_callables(topology: Topology) -> list[tuple[int, str, str, str]]:
    """(line, stage, field, dotted path) for every path into the standard library."""
    found = []
    for spec in topology.stages.values():
        named = [("factory", spec.factory), ("route_fn", spec.route_fn), ("merge_fn", spec.merge_fn)]
        named += [(f"project.{target}", path) for target, path in spec.project.items()]
        for field, dotted in named:
            if dotted and system_module(dotted):
                found.append((spec.line, spec.name, field, dotted))
    return found
