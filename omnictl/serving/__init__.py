"""The OpenAI-compatible HTTP server: ``omnictl serve`` is :func:`serve` with a :class:`ServeConfig` from the command line."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening, default_topology, run_server

__all__ = ["HttpConfig", "Listening", "ServeConfig", "default_topology", "run_server", "serve"]


def serve(config: ServeConfig, on_ready: Callable[[Listening], Awaitable[None] | None] | None = None) -> None:
    """Launch the topology and serve it until Ctrl-C / SIGTERM (blocking)."""
    asyncio.run(run_server(config, on_ready))
