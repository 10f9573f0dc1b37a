"""Start and stop a real `omnictl serve` process on a free loopback port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FAST_TOPOLOGY = HERE / "fast.yaml"
API_KEY = "test-key-123"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
_URL = re.compile(r"listening on (http://\S+)")



@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str = ""
    output: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.output)


def _pump(server: ServerProcess, ready: threading.Event) -> None:
    assert server.process.stdout is not None
    for line in server.process.stdout:
        server.output.append(line)
        match = _URL.search(line)
        if match and not server.url:
            server.url = match.group(1)
            ready.set()
    ready.set()


def start_server(*args: str, ready_timeout: float = READY_TIMEOUT_S, open_files: int | None = None,
                 cwd: Path | None = None) -> ServerProcess:
    """``open_files``: the server's open-files limit (RLIMIT_NOFILE), as ``ulimit -n`` would set it;
    ``cwd``: its working directory (the repository's by default)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "omnictl.cli.main", "serve", *args, "--port", "0", "--no-dashboard"]

    def limit_files() -> None:
        import resource

        assert open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    process = subprocess.Popen(
        command, cwd=cwd or REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        preexec_fn=limit_files if open_files is not None else None,
    )
    server = ServerProcess(process)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(server, ready), daemon=True).start()
    if not ready.wait(ready_timeout) or not server.url:
        process.kill()
        raise AssertionError(f"omnictl serve did not become ready:\n{server.text()}")
    return server


def stop_server(server: ServerProcess) -> int:
    """Ctrl-C, as a user would; returns the exit code."""
    server.process.send_signal(signal.SIGINT)
    try:
        return server.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise AssertionError(f"omnictl serve did not stop on Ctrl-C:\n{server.text()}") from None


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


@contextmanager
def serving_in_process(config: Any, name: str = "in-process omnictl serve") -> Iterator[Any]:
    """``run_server(config)`` on a thread of this process, so a test can read the server's own
    state beside its answers; yields its ``Listening`` once ready, stops it on the way out
    and fails naming the server if it did not start or stop."""
    import asyncio
    import queue

    from omnictl.serving.server import Listening, run_server

    ready: queue.Queue[Listening | BaseException] = queue.Queue()

    async def on_ready(listening: Listening) -> None:
        ready.put(listening)

    def serve() -> None:
        try:
            asyncio.run(run_server(config, on_ready, handle_signals=False))
        except BaseException as exc:  # handed to the test, which fails naming it
            ready.put(exc)

    thread = threading.Thread(target=serve, name=name)
    thread.start()
    listening = ready.get(timeout=120)
    if isinstance(listening, BaseException):
        raise AssertionError(f"{name} did not start") from listening
    try:
        yield listening
    finally:
        assert listening.loop is not None
        listening.loop.call_soon_threadsafe(listening.stop)
        thread.join(60)
    assert not thread.is_alive(), f"{name} did not stop"
