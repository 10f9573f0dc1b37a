"""Launch a topology and serve it over HTTP in one asyncio loop.

The port is bound before the pipeline starts, so ``/health`` answers 503 while
models load, and a port already in use fails at once with a clear message rather
than after minutes of loading. Ctrl-C (or SIGTERM) stops accepting requests, lets
open responses finish for a few seconds, then shuts every stage process down.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import uvicorn

from omnictl.data import DEFAULT_TOPOLOGY, data_path
from omnictl.exceptions import LaunchError, ListenError, StartupError
from omnictl.launch_config import LaunchConfig
from omnictl.serving.app import ServingState, create_app, watch_liveness
from omnictl.serving.common.connections import ConnectionGuard, connection_cap
from omnictl.serving.common.guard import RequestGuard
from omnictl.serving.common.tracking import end_in_flight
from omnictl.serving.config import ServeConfig
from omnictl.serving.realtime.session.context import listens

GRACEFUL_SHUTDOWN_S = 5
log = logging.getLogger("omnictl.serving")


def default_topology() -> Path:
    """The embedded default topology, from the package data."""
    path = data_path(DEFAULT_TOPOLOGY)
    if path.is_file():
        return path
    raise LaunchError("default", f"the embedded topology {DEFAULT_TOPOLOGY} is missing from this installation ({path})")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens where this machine alone can reach it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"port {port} is in use", hint="try --port 0") from exc
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: :func:`run_server` owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Listening:
    """Where a running server is reachable, handed to the ready callback."""

    url: str
    state: ServingState
    pipeline: Any
    stop: Callable[[], None]
    loop: asyncio.AbstractEventLoop | None = None  # the loop the server and pipeline run on


def _beside(launch: LaunchConfig, name: str) -> LaunchConfig:
    """The launch of a second pipeline of the server: its own run dir (under the first's, if set)."""
    run_dir = launch.profiling.run_dir
    return launch if run_dir is None else launch.replace(run_dir=run_dir / name)


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def run_server(
    config: ServeConfig,
    on_ready: Callable[[Listening], Awaitable[None] | None] | None = None,
    handle_signals: bool = True,
) -> None:
    """Serve until stopped (Ctrl-C, SIGTERM, or ``Listening.stop``)."""
    from omnictl.pipeline import Pipeline  # the runtime: heavy, so imported only when serving

    http, limits = config.http, config.limits
    if http.api_key is not None and not http.api_key.strip():
        # An empty key once meant "no authentication" without a word.
        raise StartupError(
            "the API key is empty", hint="pass a non-empty --api-key (or OMNICTL_API_KEY), or none at all"
        )
    topology = Path(config.topology) if config.topology is not None else default_topology()
    sock = bind(http.host, http.port)
    port = sock.getsockname()[1]
    state = ServingState(
        model_name=topology.stem,
        limits=limits,
        api_key=http.api_key,
        aliases=http.served_model_names,
        max_underrun_ms=config.max_underrun_ms,
    )
    guard = ConnectionGuard(connection_cap(limits.max_connections), limits.header_timeout_s)
    uvicorn_config = uvicorn.Config(
        create_app(state, RequestGuard.for_bind(http.host, port, http.allowed_hosts, http.allowed_origins)),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=guard.http_protocol(),
        ws=guard.websocket_protocol(),
        limit_concurrency=None,
        backlog=2048,
        # No permessage-deflate: 1 KB of deflated zeros is a 1 MB realtime event, and uvicorn
        # inflates every frame of a read (64 KB: ~64 MB) on the event loop before the app
        # sees one. Audio in base64 barely compresses anyway.
        ws_per_message_deflate=False,
    )
    server = _QuietServer(uvicorn_config)
    stopping = asyncio.Event()

    def stop() -> None:
        if stopping.is_set():
            server.force_exit = True  # a second Ctrl-C does not wait for open responses
        stopping.set()
        server.should_exit = True

    loop = asyncio.get_running_loop()
    previous_handler = guard.accept_errors(loop)
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
    serving.add_done_callback(lambda _: stopping.set())  # uvicorn gave up: stop the pipeline too
    try:
        launch = Pipeline.launch(topology, config.launch)
        entering = asyncio.create_task(launch.__aenter__(), name="pipeline-launch")
        waiting = asyncio.create_task(stopping.wait())
        await asyncio.wait({entering, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not entering.done():  # stopped while the models were still loading
            entering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entering
            return
        pipe = entering.result()
        live = None
        liveness = asyncio.create_task(watch_liveness(state), name="liveness")  # admission skips frozen stages
        try:
            if config.live_transcriber is not None and listens(pipe.topology):
                # The served topology transcribes while the user speaks, on its own Whisper: a
                # second pipeline would be a second Whisper in memory doing the same.
                log.warning(
                    "--live-transcriber is deprecated and not used: topology %r transcribes realtime turns "
                    "while they are spoken itself (every session, by default)",
                    pipe.topology.name,
                )
            elif config.live_transcriber is not None:  # before the server is ready: its sessions use it from the first
                log.warning(
                    "--live-transcriber is deprecated: a topology that listens (voice-assistant) transcribes "
                    "realtime turns while spoken without a second pipeline"
                )
                launching = Pipeline.launch(Path(config.live_transcriber), _beside(config.launch, "live-transcriber"))
                state.live_transcriber = await launching.__aenter__()
                live = launching
            state.model_name = pipe.topology.name  # the model id is the topology's `name`
            state.pipeline = pipe
            state.tracing = pipe.otlp_endpoint is not None
            state.metrics.processes.pipeline = pipe
            if pipe.recorder is not None:
                state.profiler = pipe.recorder
            if pipe.profile is not None:
                state.metrics.profile.snapshot = pipe.profile.aggregator.snapshot
            if on_ready is not None:
                ready = on_ready(Listening(_url(http.host, port), state, pipe, stop, loop))
                if ready is not None:
                    await ready
            await stopping.wait()
            for close in state.on_stop:
                await close()
            # Open responses end with an error event and [DONE] (or a 503), not a cut connection.
            await end_in_flight(state.active, pipe.abort, "the server is shutting down")
            server.should_exit = True
            await serving
        finally:
            liveness.cancel()
            state.pipeline = None
            state.live_transcriber = None
            if live is not None:
                await live.__aexit__(None, None, None)
            await launch.__aexit__(None, None, None)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        sock.close()
        loop.set_exception_handler(previous_handler)
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
