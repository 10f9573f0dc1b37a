"""The profiler's sockets (omnictl/transports/profile_wire.py) over real ZeroMQ sockets: a
recorder's PUSH never blocks and says when a batch was not taken, the collector's PULL takes
ipc and (CurveZMQ) tcp and names an address it cannot bind, and a control request that
times out neither hangs nor wedges the next one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import omnictl
import omnictl.coordinator.request
import omnictl.profiling.events
import omnictl.topology.imports
from omnictl import profiler, request, user_code
from omnictl.transports.curve import CurveKeys
from omnictl.transports.profile_wire import (
    EVENT_SEND_HWM,
    ControlClient,
    ControlServer,
    EventPull,
    EventPush,
    wait_readable,
)


def _received(pull: EventPull, timeout_ms: int = 5000) -> bytes | None:
    if not pull.poll(timeout_ms):
        return None
    message = pull.recv_nowait()
    return None if message is None else bytes(message)


def test_events_travel_push_to_pull_over_ipc(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/events.sock"
    pull = EventPull(address)
    push = EventPush(address)
    try:
        assert pull.tcp_address is None  # no keys, no tcp
        assert pull.recv_nowait() is None and not pull.poll(0)  # nothing yet, and no blocking
        assert push.send(b"batch-1")
        assert _received(pull) == b"batch-1"
    finally:
        push.close()
        pull.close()


def test_a_push_without_a_collector_never_blocks_and_refuses_past_the_high_water_mark(tmp_path: Path) -> None:
    push = EventPush(f"ipc://{tmp_path}/nobody.sock")
    start = time.monotonic()
    taken = [push.send(b"x") for _ in range(EVENT_SEND_HWM * 4)]
    assert time.monotonic() - start < 2.0
    assert taken[0] and not taken[-1], "batches past the high-water mark are refused, not queued"
    assert sum(taken) <= EVENT_SEND_HWM * 2  # bounded: the socket's and the pipe's marks at most
    push.close()
    assert not push.send(b"after close")  # a flush racing close() loses its batch, no exception


def test_the_pull_names_the_address_it_cannot_bind(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="profiling collector cannot bind .*no-such-dir"):
        EventPull(f"ipc://{tmp_path}/no-such-dir/events.sock")
    with pytest.raises(OSError, match="profiling collector cannot bind .*no-such-dir"):
        ControlServer(f"ipc://{tmp_path}/no-such-dir/control.sock")


def test_tcp_events_need_the_launchs_keys(tmp_path: Path) -> None:
    keys = CurveKeys.generate()
    pull = EventPull(f"ipc://{tmp_path}/events.sock", tcp_host="127.0.0.1", curve=keys)
    assert pull.tcp_address is not None and pull.tcp_address.startswith("tcp://127.0.0.1:")
    stranger = CurveKeys.generate()  # knows the server's key, presents a client key of its own
    intruder_keys = CurveKeys(keys.server_public, keys.server_secret, stranger.client_public, stranger.client_secret)
    member = EventPush(pull.tcp_address, curve=keys)
    intruder = EventPush(pull.tcp_address, curve=intruder_keys)
    try:
        assert intruder.send(b"forged")
        assert member.send(b"genuine")
        assert _received(pull) == b"genuine"
        assert _received(pull, timeout_ms=300) is None, "the authenticator refused the stranger's handshake"
    finally:
        member.close()
        intruder.close()
        pull.close()


def test_control_requests_are_answered_and_a_timeout_does_not_wedge_the_next(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/control.sock"
    server = ControlServer(address)
    client = ControlClient(address)
    events = EventPull(f"ipc://{tmp_path}/events.sock")
    try:
        start = time.monotonic()
        assert client.ask(b"unanswered", timeout_s=0.1) is None
        assert time.monotonic() - start < 2.0
        assert wait_readable([events, server], 5000) == [server]  # the control socket, not the events
        assert server.recv() == b"unanswered"
        server.send(b"late")  # the timed-out request's reply: the client must drop it

        def answer() -> None:
            server.send(b"answer to " + server.recv())

        responder = threading.Thread(target=answer)
        responder.start()
        assert client.ask(b"second", timeout_s=5.0) == b"answer to second"
        responder.join(5.0)
    finally:
        client.close()
        server.close()
        events.close()


def test_the_public_modules_are_the_runtimes_own_names() -> None:
    """What serving imports from the public API is the runtime's object itself, and the old
    import paths still work."""
    assert request.RequestEventKind is omnictl.coordinator.request.RequestEventKind
    assert request.RequestHandle is omnictl.RequestHandle
    assert profiler.EventKind is omnictl.profiling.events.EventKind
    assert profiler.NullProfiler is omnictl.profiling.events.NullProfiler
    assert user_code.resolve_callable is omnictl.topology.imports.resolve_callable
