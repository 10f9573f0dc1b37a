"""omnictl: serve multi-stage omni models from a declarative YAML topology.

The public API is re-exported here; everything else is internal.
Heavy dependencies (torch, transformers) are imported lazily so that the CLI stays instant.
"""

from __future__ import annotations

from omnictl.exceptions import (
    InvalidRequest,
    LaunchError,
    OmnictlError,
    PipelineDead,
    RequestAborted,
    RequestError,
    RequestFailed,
    TopologyError,
)

__version__ = "0.1.0"

__all__ = [
    "InvalidRequest",
    "LaunchError",
    "OmnictlError",
    "PipelineDead",
    "RequestAborted",
    "RequestError",
    "RequestFailed",
    "TopologyError",
    "__version__",
]
