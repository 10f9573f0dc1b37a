"""The OpenAI-compatible HTTP server: ``omnictl serve`` is :func:`serve` with options from the command line."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from omnictl.serving.server import Listening, ServeOptions, default_topology, run_server

__all__ = ["Listening", "ServeOptions", "default_topology", "run_server", "serve"]


def serve(options: ServeOptions, on_ready: Callable[[Listening], Awaitable[None] | None] | None = None) -> None:
    """Launch the topology and serve it until Ctrl-C / SIGTERM (blocking)."""
    asyncio.run(run_server(options, on_ready))
