"""The user code a topology names (factories, ``route_fn``, ``merge_fn``, projections),
imported by the one rule the runtime uses: the topology file's directory first on the
import path, then ``sys.path`` (see :mod:`omnictl.topology.imports`).
"""

from __future__ import annotations

from omnictl.exceptions import ResolveError
from omnictl.topology.imports import import_path, resolve_callable, topology_dir

__all__ = ["ResolveError", "import_path", "resolve_callable", "topology_dir"]
