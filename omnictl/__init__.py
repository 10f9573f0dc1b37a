"""omnictl: serve multi-stage omni models from a declarative YAML topology.

The public API is re-exported here; everything else is internal.
Heavy dependencies (torch, transformers) are imported lazily so that the CLI stays instant.
"""

from __future__ import annotations

from pathlib import Path

from omnictl.exceptions import (
    AdmissionTimeout,
    InputStalled,
    InvalidRequest,
    LaunchError,
    OmnictlError,
    Overloaded,
    PipelineDead,
    RequestAborted,
    RequestError,
    RequestFailed,
    TopologyError,
    UnsupportedPayload,
)

__version__ = "0.1.0"


def default_topology() -> Path:
    """The path of the built-in topology (the CPU voice assistant) that ``omnictl serve`` and
    ``omnictl bench`` run when given none: ``omnictl.run(omnictl.default_topology(), ...)``."""
    from omnictl.data import DEFAULT_TOPOLOGY, data_path

    return data_path(DEFAULT_TOPOLOGY)


def __getattr__(name: str) -> object:
    # The runtime pulls in zmq and the process machinery: load it on first use so
    # `omnictl --help` and `omnictl validate` stay instant.
    if name in ("Pipeline", "run"):
        from omnictl import pipeline

        return getattr(pipeline, name)
    if name in ("RequestHandle", "RequestEvent", "RequestEventKind", "RequestState"):
        from omnictl.coordinator import request

        return getattr(request, name)
    raise AttributeError(f"module 'omnictl' has no attribute {name!r}")


__all__ = [
    "Pipeline",
    "RequestEvent",
    "RequestEventKind",
    "RequestHandle",
    "RequestState",
    "run",
    "default_topology",
    "AdmissionTimeout",
    "InputStalled",
    "InvalidRequest",
    "LaunchError",
    "OmnictlError",
    "Overloaded",
    "PipelineDead",
    "RequestAborted",
    "RequestError",
    "RequestFailed",
    "TopologyError",
    "UnsupportedPayload",
    "__version__",
]
