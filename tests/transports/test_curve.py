"""CurveZMQ keys of a launch over real tcp sockets on 127.0.0.1: a client with the launch's
keys is admitted, one that knows the server's key but presents its own is refused at the
handshake (by the ZAP authenticator), and the keys never show in a log line."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from omnictl.transports.curve import CurveKeys, _LaunchClients, start_authenticator

_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH}


@pytest.fixture
def served() -> Iterator[tuple[CurveKeys, zmq.Context, zmq.Socket, str]]:
    """A PULL socket serving the launch's keys, with the launch's authenticator."""
    keys = CurveKeys.generate()
    context = zmq.Context()
    authenticator = start_authenticator(context, keys)
    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    keys.serve(pull)
    pull.bind("tcp://127.0.0.1:*")
    yield keys, context, pull, pull.getsockopt_string(zmq.LAST_ENDPOINT)
    pull.close(linger=0)
    authenticator.stop()
    context.term()


def handshake(context: zmq.Context, address: str, configure) -> tuple[zmq.Socket, int]:
    """A PUSH socket configured by ``configure``, connected to ``address``, and how its
    handshake ended (the first success or failure event), within 5 s."""
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    configure(push)
    monitor = push.get_monitor_socket()
    push.connect(address)
    deadline = time.monotonic() + 5
    outcome = -1
    try:
        while time.monotonic() < deadline and outcome < 0:
            if monitor.poll(50):
                event = recv_monitor_message(monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED or event in _FAILED:
                    outcome = event
    finally:
        push.disable_monitor()
        monitor.close(linger=0)
    return push, outcome


def test_a_client_with_the_launch_keys_is_admitted_and_its_message_arrives(served) -> None:
    keys, context, pull, address = served
    push, outcome = handshake(context, address, keys.connect_as_client)
    try:
        assert outcome == zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert pull.getsockopt(zmq.MECHANISM) == zmq.CURVE and push.getsockopt(zmq.MECHANISM) == zmq.CURVE
        push.send(b"hello")
        assert pull.poll(5000) and pull.recv() == b"hello"
    finally:
        push.close(linger=0)


def test_a_client_that_presents_another_client_key_is_refused_at_the_handshake(served) -> None:
    keys, context, pull, address = served
    public, secret = zmq.curve_keypair()

    def rogue(socket: zmq.Socket) -> None:
        socket.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)  # knows the server's key
        socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, secret)

    push, outcome = handshake(context, address, rogue)
    try:
        assert outcome in _FAILED, outcome
        push.send(b"forged", zmq.NOBLOCK)
        assert pull.poll(100) == 0
    finally:
        push.close(linger=0)


def test_only_the_launch_client_key_passes_the_credentials_check() -> None:
    keys = CurveKeys.generate()
    clients = _LaunchClients(keys.client_public)
    assert clients.callback("*", keys.client_public) is True
    assert clients.callback("*", keys.server_public) is False
    assert clients.callback("*", zmq.curve_keypair()[0]) is False


def test_each_launch_makes_two_distinct_key_pairs_and_repr_hides_the_secrets() -> None:
    keys, other = CurveKeys.generate(), CurveKeys.generate()
    values = (keys.server_public, keys.server_secret, keys.client_public, keys.client_secret)
    assert all(isinstance(v, bytes) and len(v) == 40 for v in values)  # Z85 of 32 bytes
    assert len(set(values)) == 4 and keys.server_public != other.server_public
    # each public key belongs with its secret
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    text = repr(keys)
    assert keys.server_secret.decode() not in text and keys.client_secret.decode() not in text
    assert repr(keys.server_public) in text and repr(keys.client_public) in text
    assert text.startswith("CurveKeys(") and "secrets hidden" in text
