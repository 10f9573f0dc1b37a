"""``omnictl serve``'s runner (omnictl/serving/server.py) in the test process: where it binds
and what it says when it cannot, the options a launch gets, and ``run_server`` itself on the
fast topology (real stage processes, no model): ready with its URL and state, a request
answered, in-flight answers ended at shutdown, SIGTERM and Ctrl-C (also while the models
load), a second stop, and everything it installed on the loop taken back when it returns."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnictl.admission import DEFAULT_MAX_IN_FLIGHT
from omnictl.exceptions import LaunchError, ListenError, StartupError
from omnictl.launch_config import LaunchConfig
from omnictl.serving import server as server_module
from omnictl.serving.background import BackgroundServer
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.common.connections import ConnectionGuard
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening, bind, default_topology, is_loopback, run_server
from tests.serving.harness import API_KEY, FAST_TOPOLOGY

# --- where it listens -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("example.internal", False),  # a name may resolve to anything
    ],
)
def test_which_hosts_only_this_machine_can_reach(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_urls_bracket_an_ipv6_host() -> None:
    assert server_module._url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert server_module._url("::1", 9) == "http://[::1]:9"


def test_bind_listens_on_the_port_asked_and_hands_the_socket_down() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        assert sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.get_inheritable()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # listening already: a client connects before any server runs
    finally:
        sock.close()


def test_bind_takes_an_ipv6_host() -> None:
    try:
        sock = bind("::1", 0)
    except ListenError as exc:  # a machine without IPv6 on loopback
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert sock.family == socket.AF_INET6
    finally:
        sock.close()


def test_a_port_in_use_is_refused_with_a_hint_and_the_socket_closed() -> None:
    taken = bind("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ListenError) as caught:
            bind("127.0.0.1", port)
        assert str(caught.value) == f"port {port} is in use (try --port 0)"
        assert caught.value.hint == "try --port 0"
        assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.EADDRINUSE
    finally:
        taken.close()


def test_an_address_not_on_this_machine_says_where_and_why() -> None:
    with pytest.raises(ListenError) as caught:
        bind("192.0.2.1", 0)  # TEST-NET-1: never a local address
    message = str(caught.value)
    assert message.startswith("cannot listen on 192.0.2.1:0: ")
    assert "assign" in message.lower()  # the OS's reason (EADDRNOTAVAIL), not a traceback
    assert caught.value.hint is None


# --- the options ------------------------------------------------------------------------


def test_a_server_launches_with_its_config_whole_and_always_profiles_by_default() -> None:
    # the flags' mapping onto these parts: tests/cli/test_serve.py
    config = ServeConfig()
    assert config.launch.profiling.run_dir is None
    assert config.launch.profiling.profile is True
    # the one place the server's admission default differs from the Python API's
    assert config.launch == LaunchConfig.of(max_in_flight=DEFAULT_MAX_IN_FLIGHT)
    assert LaunchConfig().admission.max_in_flight is None
    changed = config.launching(run_dir="runs/x", max_restarts=2)
    assert changed.launch == LaunchConfig.of(max_in_flight=DEFAULT_MAX_IN_FLIGHT, run_dir="runs/x", max_restarts=2)
    assert (changed.http, changed.limits, config.launch.faults.max_restarts) == (config.http, config.limits, 0)


def test_the_defaults_serve_the_embedded_topology_on_loopback() -> None:
    options = ServeConfig()
    assert (options.http.host, options.http.port, options.topology) == ("127.0.0.1", 8000, None)
    path = default_topology()
    assert path.is_file() and path.suffix in (".yaml", ".yml")


def test_a_missing_embedded_topology_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(server_module, "data_path", lambda name: tmp_path / name)
    with pytest.raises(Exception, match="is missing from this installation") as caught:
        default_topology()
    assert str(tmp_path) in str(caught.value)


@pytest.mark.parametrize("key", ["", "   ", "\t"])
def test_an_empty_api_key_is_refused_before_anything_binds(key: str) -> None:
    probe = bind("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    options = ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=port, api_key=key))
    with pytest.raises(StartupError) as caught:
        asyncio.run(run_server(options))
    assert str(caught.value).startswith("the API key is empty (pass a non-empty --api-key")
    bind("127.0.0.1", port).close()  # the port was never taken


# --- run_server on a real pipeline ------------------------------------------------------


def _free_port() -> int:
    sock = bind("127.0.0.1", 0)
    try:
        return int(sock.getsockname()[1])
    finally:
        sock.close()


def _chat(url: str, text: str, **extra: Any) -> httpx.Response:
    body = {"model": "fast", "modalities": ["text"], "messages": [{"role": "user", "content": text}], **extra}
    return httpx.post(
        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )


def test_a_ready_server_answers_then_stops_and_gives_back_what_it_installed(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def on_ready(listening: Listening) -> None:  # a plain function: nothing to await
        seen["listening"] = listening
        loop = asyncio.get_running_loop()
        seen["handler_while_serving"] = loop.get_exception_handler()
        seen["sigterm_while_serving"] = signal.getsignal(signal.SIGTERM)

        def ask() -> None:
            try:
                seen["health"] = httpx.get(listening.url + "/health", timeout=30)
                seen["answer"] = _chat(listening.url, "hello there")
            finally:
                loop.call_soon_threadsafe(listening.stop)

        threading.Thread(target=ask, name="client").start()

    options = ServeConfig(
        topology=str(FAST_TOPOLOGY), http=HttpConfig(port=0, api_key=API_KEY, served_model_names=("alias",))
    ).launching(run_dir=tmp_path)

    async def main() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        before = loop.get_exception_handler()
        await run_server(options, on_ready, handle_signals=False)
        return before, loop.get_exception_handler()

    before, after = asyncio.run(main())
    listening: Listening = seen["listening"]
    assert listening.url.startswith("http://127.0.0.1:") and int(listening.url.rsplit(":", 1)[1]) > 0
    assert listening.loop is not None
    state = listening.state
    assert state.model_name == "fast"  # the topology's name
    assert state.api_key == API_KEY and state.aliases == ("alias",)
    assert listening.pipeline is not None and state.profiler is listening.pipeline.recorder
    assert state.pipeline is None  # given up when the server stopped
    assert seen["handler_while_serving"] is not None and before is None and after is None
    assert seen["sigterm_while_serving"] == signal.getsignal(signal.SIGTERM)  # handle_signals=False: untouched
    assert seen["health"].status_code == 200, seen["health"].text
    answer = seen["answer"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "echo: hello there"
    with pytest.raises(httpx.ConnectError):  # the port is closed
        httpx.get(listening.url + "/health", timeout=2)


def test_sigterm_ends_open_answers_with_an_error_and_stops(tmp_path: Path) -> None:
    lines: list[str] = []

    async def on_ready(listening: Listening) -> None:
        def stream() -> None:
            headers = {"Authorization": f"Bearer {API_KEY}"}
            body = {
                "model": "fast",
                "stream": True,
                "messages": [{"role": "user", "content": "answer slowly " + "w " * 30}],
            }
            with httpx.stream(
                "POST", listening.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
            ) as r:
                for line in r.iter_lines():
                    if not line:
                        continue  # the blank line between events
                    lines.append(line)
                    if len(lines) == 2:  # the answer has started: now stop the server
                        os.kill(os.getpid(), signal.SIGTERM)

        clients.append(threading.Thread(target=stream, name="client"))
        clients[0].start()

    clients: list[threading.Thread] = []
    before = signal.getsignal(signal.SIGTERM)
    options = ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=0, api_key=API_KEY)).launching(run_dir=tmp_path)
    asyncio.run(asyncio.wait_for(run_server(options, on_ready), 60))
    assert signal.getsignal(signal.SIGTERM) == before  # its handler was removed again
    clients[0].join(10)
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert events[-1]["error"]["message"] == "the server is shutting down", events[-1]
    assert len(events) < 25  # cut short: the slow answer had 30 words to go


def test_ctrl_c_while_the_models_load_stops_without_waiting_for_them(tmp_path: Path) -> None:
    (tmp_path / "slow_load.py").write_text(
        textwrap.dedent(
            """
            import time

            def load():
                time.sleep(60)  # a model that takes a minute to load
                return lambda data: data
            """
        )
    )
    topology = tmp_path / "slow_load.yaml"
    topology.write_text("name: slow-load\nstages:\n  - name: only\n    factory: slow_load.load\n    terminal: true\n")
    port = _free_port()
    health: list[int] = []
    ready: list[Listening] = []

    def interrupt_once_listening() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                health.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_listening, name="ctrl-c").start()
    options = ServeConfig(topology=str(topology), http=HttpConfig(port=port)).launching(
        run_dir=tmp_path / "run", ready_timeout=120
    )
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(run_server(options, ready.append), 60))
    assert health == [503]  # bound before the pipeline started: /health answered while loading
    assert not ready  # never ready
    assert time.monotonic() - started < 30  # did not wait out the minute's load
    bind("127.0.0.1", port).close()  # and the port is free again


def test_a_second_stop_does_not_wait_for_open_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags: dict[str, bool] = {}
    real_server = server_module._QuietServer

    class Recording(real_server):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            flags["made"] = True
            servers.append(self)

    servers: list[Any] = []
    monkeypatch.setattr(server_module, "_QuietServer", Recording)

    def on_ready(listening: Listening) -> None:
        listening.stop()
        flags["after_one"] = servers[0].force_exit
        listening.stop()
        flags["after_two"] = servers[0].force_exit

    options = ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=0, api_key=API_KEY)).launching(run_dir=tmp_path)
    asyncio.run(asyncio.wait_for(run_server(options, on_ready, handle_signals=False), 60))
    assert flags == {"made": True, "after_one": False, "after_two": True}
    assert servers[0].should_exit is True


def test_the_uvicorn_config_bounds_what_a_client_can_make_it_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[Any] = []
    real_server = server_module._QuietServer

    class Recording(real_server):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any) -> None:
            configs.append(config)
            super().__init__(config)

    monkeypatch.setattr(server_module, "_QuietServer", Recording)
    options = ServeConfig(
        topology=str(FAST_TOPOLOGY),
        http=HttpConfig(port=0),
        limits=Limits(max_connections=50, header_timeout_s=7.0),
    ).launching(run_dir=tmp_path)
    asyncio.run(asyncio.wait_for(run_server(options, lambda listening: listening.stop(), handle_signals=False), 60))
    (config,) = configs
    assert config.ws_per_message_deflate is False  # a deflate bomb is inflated before the app sees it
    assert config.lifespan == "off" and config.access_log is False and config.log_level == "warning"
    assert config.timeout_graceful_shutdown == server_module.GRACEFUL_SHUTDOWN_S == 5
    assert config.limit_concurrency is None and config.backlog == 2048
    assert config.http.__name__ == "GuardedH11Protocol" and config.ws.__name__ == "GuardedWebSocketProtocol"
    # the guard the protocols share has the options' limits
    (guard,) = [
        cell.cell_contents
        for cell in config.http.connection_made.__closure__
        if isinstance(cell.cell_contents, ConnectionGuard)
    ]
    assert (guard.max_connections, guard.header_timeout_s) == (50, 7.0)


def test_uvicorn_keeps_its_hands_off_the_signals() -> None:
    import uvicorn

    quiet = server_module._QuietServer(uvicorn.Config(app=lambda *a: None))
    before = signal.getsignal(signal.SIGINT)
    with quiet.capture_signals():
        assert signal.getsignal(signal.SIGINT) == before
    assert signal.getsignal(signal.SIGINT) == before


# --- BackgroundServer: a server on its own thread ----------------------------------------


def test_a_background_server_serves_from_its_own_thread_and_stops_on_exit(tmp_path: Path) -> None:
    options = ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=0, api_key=API_KEY)).launching(run_dir=tmp_path)
    background = BackgroundServer(options, start_timeout=60)
    assert (background.config, background.start_timeout) == (options, 60)
    with background as listening:
        assert listening.loop is not None and listening.loop.is_running()  # on the server's thread, not this one
        server_threads = [t for t in threading.enumerate() if t.name == "omnictl-server"]
        assert len(server_threads) == 1 and server_threads[0].daemon
        answer = _chat(listening.url, "from the caller's thread")
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"].startswith("echo: from")
    assert not server_threads[0].is_alive()  # stopped and joined by the with block
    with pytest.raises(httpx.ConnectError):
        httpx.get(listening.url + "/health", timeout=2)


def test_a_background_server_that_cannot_start_says_why_in_the_callers_thread() -> None:
    taken = bind("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        background = BackgroundServer(ServeConfig(topology=str(FAST_TOPOLOGY), http=HttpConfig(port=port)), start_timeout=30)
        with pytest.raises(LaunchError) as caught:
            background.__enter__()
        assert str(caught.value).endswith(
            f"the server stopped before it was ready: port {port} is in use (try --port 0)"
        )
        assert isinstance(caught.value.__cause__, ListenError)
        background.__exit__(None, None, None)  # nothing to stop: returns at once
    finally:
        taken.close()


def test_a_background_server_not_ready_in_time_is_a_launch_error(tmp_path: Path) -> None:
    (tmp_path / "slow_load.py").write_text(
        "import time\n\ndef load():\n    time.sleep(60)\n    return lambda data: data\n"
    )
    topology = tmp_path / "slow_load.yaml"
    topology.write_text("name: slow-load\nstages:\n  - name: only\n    factory: slow_load.load\n    terminal: true\n")
    children = _children()  # a test runner may have its own (mutmut's fork server)
    background = BackgroundServer(
        ServeConfig(topology=str(topology), http=HttpConfig(port=0)).launching(run_dir=tmp_path / "run"), start_timeout=0.5
    )
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        background.__enter__()
    assert str(caught.value).endswith("the server did not become ready within 0.5s")
    # given up, not left loading: the launch was cancelled and the server's thread has ended
    assert time.monotonic() - started < 20
    assert not background._thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "omnictl-server"]
    assert _children() == children  # and the stage process loading its model was stopped


def _children() -> list[int]:
    """The pids of this process's living children (from /proc)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(entry.name))
    return found
