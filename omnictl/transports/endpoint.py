"""One process's end of the wire: every ZeroMQ socket the runtime opens, in one object.

The coordinator and every stage process own one :class:`Endpoint`. It holds the ZeroMQ
context, CurveZMQ (the ZAP authenticator, server keys on tcp binds, client keys on tcp
connects), the sockets it binds, the address book of its peers with one PUSH socket per
peer (reconnected when a restarted peer reports a new port, dropped when a peer dies), the
per-loop batching of outgoing messages, the shared-memory slot pools it lends from (and
their reclaim when a borrower dies) and the payload codec of each (stage, transport). The
coordinator and the Stage only say what to send to whom; neither opens a socket itself.

How a peer is reached: over ``ipc://`` when it runs on this endpoint's node and has an ipc
address, else over the ``tcp://`` address it reported (handed out in the coordinator's
hellos).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import zmq
import zmq.asyncio
from zmq.auth.thread import ThreadAuthenticator

from omnictl import messages as m
from omnictl.transports.codec import PayloadCodec
from omnictl.transports.curve import CurveKeys, start_authenticator
from omnictl.transports.drain import Outgoing
from omnictl.transports.frames import receive
from omnictl.transports.kinds import RelayKnobs, Transport, WireLayout
from omnictl.transports.registry import codec_for
from omnictl.transports.shm import SlotPool


def resolve_data_host(data_host: str | None, launcher: str) -> str:
    """The address tcp sockets bind and advertise here: given, ``$OMNICTL_DATA_HOST``, this
    node's Ray address (``ray``), or 127.0.0.1 (``local``)."""
    override = data_host or os.environ.get("OMNICTL_DATA_HOST")
    if override:
        return override
    if launcher == "ray":
        import ray

        return str(ray.util.get_node_ip_address())
    return "127.0.0.1"


class Broadcasts:
    """The coordinator's broadcasts (aborts, hellos, lost processes, stats requests) as one
    process receives them: what a stage process reads, without holding the socket itself."""

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self._socket = socket

    async def next(self) -> bytes:
        """The next broadcast's header (broadcasts carry no frames)."""
        return (await receive(self._socket))[0]


class Endpoint:
    """The sockets, peers, slot pools and codecs of one process (``owner``: its OS process
    name, or :data:`omnictl.messages.COORDINATOR`). ``layout`` is what it reads of the
    topology (``Topology.wire_layout()``: the transports never import the topology, see
    tests/test_layering.py). Build it on the process's event loop; :meth:`close` releases
    everything it holds."""

    def __init__(
        self,
        owner: str,
        layout: WireLayout,
        *,
        ipc_addresses: dict[str, str],  # OS process -> ipc:// address, for peers on this node
        node: str | None = None,  # this process's `node` label (None: the coordinator's machine)
        curve: CurveKeys | None = None,  # the launch's keys: tcp sockets are CurveZMQ when given
    ) -> None:
        self.owner = owner
        self.layout = layout
        self.node = node
        self.curve = curve
        self.context = zmq.asyncio.Context()
        # Plain sockets on the same context for the hot path: sends never block (no
        # high-water mark), and receiving drains every ready message per wake-up.
        self.plain: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(self.context.underlying)
        self._authenticator: ThreadAuthenticator | None = None
        if curve is not None:  # before any tcp socket: every handshake goes through it
            self._authenticator = start_authenticator(zmq.Context.shadow(self.context.underlying), curve)
        self._ipc = ipc_addresses
        self._node_of = layout.nodes
        self.tcp_addresses: dict[str, str] = {}  # OS process -> tcp://, from the coordinator's hellos
        self._peers: dict[str, zmq.Socket] = {}
        self._own: list[zmq.Socket | zmq.asyncio.Socket] = []  # bound, subscribed or fixed sockets
        self.out = Outgoing()  # several messages per send to each socket, per loop iteration
        self.pools: dict[str, SlotPool] = {}  # by the stage that lends from it
        self._codecs: dict[tuple[str, Transport], PayloadCodec] = {}

    # --- sockets this process binds or connects once ---------------------------------

    def pull(self, ipc_address: str | None = None) -> zmq.Socket:
        """The plain PULL socket this process receives on (read it with a Drain)."""
        socket = self.plain.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        if ipc_address is not None:
            socket.bind(ipc_address)
        self._own.append(socket)
        return socket

    def publisher(self, ipc_address: str) -> zmq.asyncio.Socket:
        """The PUB socket of broadcasts (aborts, hellos): never drops for a slow reader."""
        socket = self.context.socket(zmq.PUB)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.bind(ipc_address)
        self._own.append(socket)
        return socket

    def subscriber(self, address: str) -> zmq.asyncio.Socket:
        """A SUB socket on the coordinator's broadcasts, taking every message."""
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._secure_connect(socket, address)
        self._own.append(socket)
        return socket

    def broadcasts(self, address: str) -> Broadcasts:
        """The coordinator's broadcasts at ``address``, subscribed to."""
        return Broadcasts(self.subscriber(address))

    def bind_tcp(self, socket: zmq.Socket | zmq.asyncio.Socket, host: str, port: int = 0) -> str:
        """Take tcp traffic on ``socket`` too, at ``host``; returns the address bound. The port
        is OS-chosen unless ``port`` is asked for (a restarted process asks for its
        predecessor's) and still free."""
        if self.curve is not None:  # the ipc endpoint bound before keeps no security
            self.curve.serve(socket)
        try:
            socket.bind(f"tcp://{host}:{port or '*'}")
        except zmq.ZMQError:
            if not port:
                raise
            socket.bind(f"tcp://{host}:*")  # taken meanwhile: the coordinator passes the new one on
        return str(socket.getsockopt_string(zmq.LAST_ENDPOINT))

    def push(self, address: str) -> zmq.Socket:
        """A plain PUSH socket to a fixed address (the coordinator's control socket)."""
        socket = self._push(address)
        self._own.append(socket)
        return socket

    def _push(self, address: str) -> zmq.Socket:
        socket = self.plain.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)  # never block the event loop; memory is the bound
        socket.setsockopt(zmq.LINGER, 0)
        self._secure_connect(socket, address)
        return socket

    def _secure_connect(self, socket: zmq.Socket | zmq.asyncio.Socket, address: str) -> None:
        if address.startswith("tcp://") and self.curve is not None:
            self.curve.connect_as_client(socket)
        socket.connect(address)

    # --- peers ---------------------------------------------------------------------------

    def peer(self, process: str) -> zmq.Socket:
        """The PUSH socket to the OS process ``process`` (a replica name), made on first use."""
        socket = self._peers.get(process)
        if socket is None:
            if self._node_of.get(process, self.node) == self.node and process in self._ipc:
                address = self._ipc[process]
            elif process in self.tcp_addresses:
                address = self.tcp_addresses[process]
            else:
                raise LookupError(
                    f"no tcp address for process {process!r} on node "
                    f"{self._node_of.get(process)!r} yet (the coordinator sends them at start)"
                )
            socket = self._peers[process] = self._push(address)
        return socket

    def set_tcp_addresses(self, addresses: dict[str, str]) -> None:
        """The address book; a restarted peer may have a new port: reconnect to it."""
        for process, address in addresses.items():
            if self.tcp_addresses.get(process, address) != address:
                self.close_peer(process)
            self.tcp_addresses[process] = address

    def close_peer(self, process: str) -> None:
        """Drop the socket to ``process`` with what is still queued for it."""
        socket = self._peers.pop(process, None)
        if socket is not None:
            self.out.discard(socket)
            socket.close(linger=0)

    def lost(self, process: str) -> None:
        """The OS process ``process`` died: drop the socket to it (what is still queued there
        was for requests that failed with it) and take back the slots lent to it."""
        self.close_peer(process)
        for pool in self.pools.values():
            pool.reclaim(process)

    # --- payloads ------------------------------------------------------------------------

    def pool(self, stage: str, knobs: RelayKnobs | None = None) -> SlotPool:
        """The slots ``stage`` lends its shm payloads from (``knobs``: default its relay's)."""
        pool = self.pools.get(stage)
        if pool is None:
            relay = knobs or self.layout.relays[stage]
            pool = self.pools[stage] = SlotPool(self.owner, stage, relay.slot_bytes, relay.slots)
        return pool

    def codec(self, stage: str, transport: Transport, knobs: RelayKnobs | None = None) -> PayloadCodec:
        """How ``stage``'s payloads are encoded for ``transport`` (made once)."""
        codec = self._codecs.get((stage, transport))
        if codec is None:
            relay = knobs or self.layout.relays[stage]
            codec = self._codecs[(stage, transport)] = codec_for(
                transport, self.pool(stage, relay), relay, self.layout.allow_pickle
            )
        return codec

    def send(self, socket: zmq.Socket, message: Any, frames: Sequence[memoryview] = ()) -> None:
        """Queue ``message`` (a runtime message struct) with its tensor frames for ``socket``;
        it leaves at the end of this loop iteration, batched with the others."""
        self.out.send(socket, m.encode(message), list(frames))

    def send_to(
        self,
        process: str,
        message: Any,
        frames: Sequence[memoryview] = (),
        payload: m.EncodedPayload | None = None,
        lender: str | None = None,
    ) -> None:
        """Send to the peer ``process``; a ``payload`` in shared memory lent from ``lender``'s
        pool is taken back if that peer dies before releasing it."""
        if payload is not None and payload.shm is not None and lender is not None:
            self.pool(lender).sent(payload.shm, process)
        self.send(self.peer(process), message, frames)

    def flush(self) -> None:
        """Send now what is queued."""
        self.out.flush()

    def close(self, linger_ms: int = 0) -> None:
        """``linger_ms``: how long queued messages to fixed addresses may still go out (a
        launch failure's report must)."""
        self.out.flush()
        for pool in self.pools.values():
            pool.close()
        for socket in self._peers.values():
            socket.close(linger=0)
        for own in self._own:
            own.close(linger=linger_ms)
        if self._authenticator is not None:
            self._authenticator.stop()
        self.context.term()
