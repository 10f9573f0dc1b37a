"""CurveZMQ on every TCP socket of a launch: keys made by the coordinator at each launch.

The coordinator is the authority: it generates one server key pair (every process that binds a
tcp socket serves with it) and one client key pair (every process that connects presents it),
and hands both to its workers with their configuration (a private pipe, or Ray call
arguments), never through a file. Each process runs a ZAP authenticator that admits exactly
the launch's client key, so a peer without the keys can neither complete a handshake to
inject a message nor read one; traffic is encrypted. ``ipc://`` sockets (one machine, file
permissions) stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator


@dataclass(frozen=True)
class CurveKeys:
    """Z85-encoded key pairs; ``repr`` hides the secrets so logs never carry them."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> CurveKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def __repr__(self) -> str:
        return f"CurveKeys(server_public={self.server_public!r}, client_public={self.client_public!r}, secrets hidden)"

    def serve(self, socket: zmq.Socket) -> None:
        """For a socket about to bind a tcp endpoint (endpoints bound before keep no security)."""
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.server_secret)

    def connect_as_client(self, socket: zmq.Socket) -> None:
        """For a socket about to connect to a tcp endpoint."""
        socket.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.client_public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.client_secret)


class _LaunchClients:
    """ZAP credentials provider: the launch's client key, and no other."""

    def __init__(self, client_public: bytes) -> None:
        self.client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.client_public


def start_authenticator(context: zmq.Context, keys: CurveKeys) -> ThreadAuthenticator:
    """Admit only the launch's client key on the CURVE sockets of ``context`` (a sync context:
    shadow an asyncio one). Start it before binding; stop it on close."""
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", credentials_provider=_LaunchClients(keys.client_public))
    return authenticator
