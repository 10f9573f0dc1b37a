"""One process's Endpoint over real ZeroMQ sockets: which address each peer is reached at
(ipc on this node, tcp elsewhere), the address book's reconnects, the slot pools and codecs
it lends and builds, what a lost peer gives back, and CurveZMQ on its tcp sockets."""

from __future__ import annotations

import asyncio
import os
import socket as socket_module
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import numpy as np
import pytest
import zmq

from omnictl import messages as m
from omnictl.topology import loads
from omnictl.topology.model import RelayKnobs, Transport
from omnictl.transports.codec import PayloadCodec
from omnictl.transports.curve import CurveKeys
from omnictl.transports.endpoint import Endpoint, resolve_data_host
from omnictl.transports.tcp import TcpCodec

# `one` (this endpoint) and `two` (two replicas) on the coordinator's node; `far` on another.
TOPOLOGY = loads(
    """
processes:
  two: {replicas: 2}
  far: {node: box-b}
stages:
  - name: a
    factory: m.a
    process: one
    next: [b]
    relay: {slot_bytes: 4096, slots: 3, inline_bytes: 64}
  - name: b
    factory: m.b
    process: two
    next: [c]
  - name: c
    factory: m.c
    process: far
    terminal: true
    modality: text
allow_pickle: true
""",
    "t.yaml",
)
LAYOUT = TOPOLOGY.wire_layout()  # what an Endpoint is handed: the transports never read the topology itself
CTX = m.RequestContext("r1", {}, ("a", "b", "c"))


def test_the_layout_is_what_the_endpoint_reads_of_the_topology() -> None:
    assert LAYOUT.nodes == {"one": None, "two#0": None, "two#1": None, "far": "box-b"}  # every replica
    assert LAYOUT.relays["a"] == RelayKnobs(slot_bytes=4096, slots=3, inline_bytes=64)
    assert LAYOUT.relays["b"] == RelayKnobs() and LAYOUT.allow_pickle is True


def skip(dst: str) -> m.Skip:
    return m.Skip(CTX, "a", dst)


def segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"omx{os.getpid()}_")}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # ipc:// paths must stay short (about 100 bytes): pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="omx-ep-") as tmp:
        yield Path(tmp)


class Peers:
    """PULL sockets standing in for the other processes, on a context of the test's own."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []

    def pull(self, address: str) -> tuple[zmq.Socket, str]:
        socket = self.context.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, 5000)  # a missing message fails the test, it does not hang it
        socket.bind(address)
        self.sockets.append(socket)
        return socket, socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close(linger=0)
        self.context.term()


@pytest.fixture
def peers() -> Iterator[Peers]:
    made = Peers()
    yield made
    made.close()


def received(socket: zmq.Socket) -> str:
    """The destination of the Skip that arrived on ``socket``: which send it was."""
    message = m.inbound_decoder.decode(socket.recv())
    assert isinstance(message, m.Skip)
    return message.dst


def nothing_on(socket: zmq.Socket, ms: int = 50) -> bool:
    return socket.poll(ms) == 0


def on_loop(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


def endpoint(tmp: Path, **kwargs: Any) -> Endpoint:
    ipc = {name: f"ipc://{tmp}/{name.replace('#', '-')}" for name in ("one", "two#0", "two#1", "far")}
    return Endpoint("one", LAYOUT, ipc_addresses=kwargs.pop("ipc", ipc), **kwargs)


def test_the_data_host_is_the_one_given_then_the_environment_then_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNICTL_DATA_HOST", "10.0.0.7")
    assert resolve_data_host("10.1.1.1", "local") == "10.1.1.1"
    assert resolve_data_host(None, "local") == "10.0.0.7"
    assert resolve_data_host(None, "ray") == "10.0.0.7"
    monkeypatch.delenv("OMNICTL_DATA_HOST")
    assert resolve_data_host(None, "local") == "127.0.0.1"
    assert resolve_data_host("", "local") == "127.0.0.1"


def test_under_ray_the_data_host_is_this_nodes_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    ray_util = pytest.importorskip("ray.util")
    monkeypatch.delenv("OMNICTL_DATA_HOST", raising=False)
    assert resolve_data_host(None, "ray") == str(ray_util.get_node_ip_address())


def test_a_peer_on_this_node_is_reached_over_ipc_and_its_socket_is_made_once(short_tmp: Path, peers: Peers) -> None:
    two, address = peers.pull(f"ipc://{short_tmp}/two-1")

    async def body() -> None:
        ep = endpoint(short_tmp, ipc={"two#1": address})
        try:
            socket = ep.peer("two#1")
            assert ep.peer("two#1") is socket
            ep.send_to("two#1", skip("over-ipc"))
            ep.flush()
            assert received(two) == "over-ipc"
        finally:
            ep.close()

    on_loop(body)


def test_a_peer_on_another_node_is_reached_over_tcp_even_with_an_ipc_address(short_tmp: Path, peers: Peers) -> None:
    ipc_far, ipc_address = peers.pull(f"ipc://{short_tmp}/far")
    tcp_far, tcp_address = peers.pull("tcp://127.0.0.1:*")

    async def body() -> None:
        ep = endpoint(short_tmp, ipc={"far": ipc_address})
        try:
            with pytest.raises(LookupError, match=r"no tcp address for process 'far' on node 'box-b' yet"):
                ep.peer("far")
            ep.set_tcp_addresses({"far": tcp_address})
            ep.send_to("far", skip("over-tcp"))
            ep.flush()
            assert received(tcp_far) == "over-tcp"
            assert nothing_on(ipc_far)
        finally:
            ep.close()

    on_loop(body)


def test_an_endpoint_on_a_labelled_node_reaches_its_own_node_over_ipc_and_the_coordinators_over_tcp(
    short_tmp: Path, peers: Peers
) -> None:
    far, far_ipc = peers.pull(f"ipc://{short_tmp}/far")
    one_ipc_socket, one_ipc = peers.pull(f"ipc://{short_tmp}/one")
    one_tcp_socket, one_tcp = peers.pull("tcp://127.0.0.1:*")

    async def body() -> None:
        ep = Endpoint("far", LAYOUT, ipc_addresses={"far": far_ipc, "one": one_ipc}, node="box-b")
        try:
            ep.set_tcp_addresses({"one": one_tcp})
            ep.send_to("far", skip("same-node"))
            ep.send_to("one", skip("other-node"))
            ep.flush()
            assert received(far) == "same-node"
            assert received(one_tcp_socket) == "other-node"
            assert nothing_on(one_ipc_socket)
        finally:
            ep.close()

    on_loop(body)


def test_a_new_tcp_address_for_a_peer_reconnects_and_the_same_one_keeps_the_socket(
    short_tmp: Path, peers: Peers
) -> None:
    old, old_address = peers.pull("tcp://127.0.0.1:*")
    new, new_address = peers.pull("tcp://127.0.0.1:*")

    async def body() -> None:
        ep = endpoint(short_tmp)
        try:
            ep.set_tcp_addresses({"far": old_address})
            first = ep.peer("far")
            ep.set_tcp_addresses({"far": old_address})  # the same book again: nothing changes
            assert ep.peer("far") is first
            ep.send_to("far", skip("queued-for-the-old-one"))
            ep.set_tcp_addresses({"far": new_address})  # restarted with a new port
            assert first.closed and ep.tcp_addresses == {"far": new_address}
            ep.send_to("far", skip("to-the-new-one"))
            ep.flush()
            assert received(new) == "to-the-new-one"
            assert nothing_on(old)  # what was queued for the dead socket went with it
        finally:
            ep.close()

    on_loop(body)


def test_a_lost_peer_gives_back_the_slots_lent_to_it_and_loses_what_was_queued(short_tmp: Path, peers: Peers) -> None:
    two0, address0 = peers.pull(f"ipc://{short_tmp}/two-0")
    two1, address1 = peers.pull(f"ipc://{short_tmp}/two-1")

    async def body() -> None:
        ep = endpoint(short_tmp, ipc={"two#0": address0, "two#1": address1})
        try:
            codec = ep.codec("a", Transport.SHM)
            to_dead = codec.encode({"x": np.ones(200)})
            to_alive = codec.encode({"x": np.ones(200)})
            ep.send_to("two#0", m.DataReady(CTX, "a", "b", to_dead, 0), payload=to_dead, lender="a")
            ep.send_to("two#1", m.DataReady(CTX, "a", "b", to_alive, 0), payload=to_alive, lender="a")
            assert ep.pools["a"].in_use == 2
            ep.lost("two#0")
            assert ep.pools["a"].in_use == 1  # only the dead one's slot came back
            ep.flush()
            assert isinstance(m.inbound_decoder.decode(two1.recv()), m.DataReady)
            assert nothing_on(two0)
            assert ep.peer("two#0") is not None  # a replacement is reached afresh
        finally:
            ep.close()

    on_loop(body)


def test_a_payload_sent_without_its_lender_or_inline_is_not_tracked(short_tmp: Path, peers: Peers) -> None:
    two0, address0 = peers.pull(f"ipc://{short_tmp}/two-0")

    async def body() -> None:
        ep = endpoint(short_tmp, ipc={"two#0": address0})
        try:
            codec = ep.codec("a", Transport.SHM)
            unlent = codec.encode({"x": np.ones(200)})
            inline = codec.encode({"x": 1})
            assert unlent.shm is not None and inline.shm is None
            ep.send_to("two#0", m.DataReady(CTX, "a", "b", unlent, 0), payload=unlent)
            ep.send_to("two#0", m.DataReady(CTX, "a", "b", inline, 0), payload=inline, lender="a")
            ep.lost("two#0")
            assert ep.pools["a"].in_use == 1  # not known to have gone to two#0: not taken back
        finally:
            ep.close()

    on_loop(body)


def test_each_stage_lends_from_one_pool_of_its_relay_knobs_owned_by_this_process(short_tmp: Path) -> None:
    async def body() -> None:
        ep = endpoint(short_tmp)
        try:
            pool = ep.pool("a")
            assert ep.pool("a") is pool and ep.pools == {"a": pool}
            assert (pool.owner, pool.stage, pool.slot_bytes, pool.slots) == ("one", "a", 4096, 3)
            own = ep.pool("b", RelayKnobs(slot_bytes=512, slots=1))
            assert (own.stage, own.slot_bytes, own.slots) == ("b", 512, 1)
            ref, view = pool.acquire(100)
            view.release()
            assert (ref.owner, ref.stage) == ("one", "a")
        finally:
            ep.close()

    on_loop(body)


def test_each_stage_and_transport_has_one_codec_over_the_stages_pool(short_tmp: Path) -> None:
    async def body() -> None:
        ep = endpoint(short_tmp)
        try:
            shm = ep.codec("a", Transport.SHM)
            assert ep.codec("a", Transport.SHM) is shm and type(shm) is PayloadCodec
            assert shm.pool is ep.pool("a") and shm.knobs == TOPOLOGY.stages["a"].relay
            assert shm.allow_pickle is True  # the topology's opt-in
            tcp = ep.codec("a", Transport.TCP)
            assert type(tcp) is TcpCodec and tcp is not shm and tcp.pool is shm.pool
            knobs = RelayKnobs(slot_bytes=1024, slots=1, inline_bytes=8)
            own = ep.codec("b", Transport.SHM, knobs)
            assert own.knobs == knobs and ep.pool("b").slot_bytes == 1024
        finally:
            ep.close()

    on_loop(body)


def test_close_sends_what_is_queued_to_fixed_addresses_and_unlinks_the_pools(short_tmp: Path, peers: Peers) -> None:
    coordinator, address = peers.pull(f"ipc://{short_tmp}/coordinator")
    before = segments()

    async def body() -> None:
        ep = endpoint(short_tmp)
        control = ep.push(address)
        payload = ep.codec("a", Transport.SHM).encode({"x": np.ones(200)})  # a slot: a segment
        assert payload.shm is not None and len(segments() - before) == 1
        ep.send(control, skip("the-last-report"))
        ep.close(linger_ms=2000)  # not flushed before: close sends it
        assert control.closed and ep.context.closed
        assert segments() <= before

    on_loop(body)
    assert received(coordinator) == "the-last-report"


def test_sends_never_block_on_a_peer_that_is_not_reading(short_tmp: Path) -> None:
    # No high-water mark: with ZeroMQ's default (1,000) the 1,001st send would block the loop.
    async def body() -> None:
        ep = endpoint(short_tmp)
        try:
            socket = ep.peer("two#0")  # nothing binds its address
            for _ in range(3000):
                socket.send(b"x", zmq.NOBLOCK)
            assert socket.getsockopt(zmq.LINGER) == 0
        finally:
            ep.close()

    on_loop(body)


def test_the_pull_socket_and_the_broadcasts_carry_messages(short_tmp: Path) -> None:
    async def body() -> None:
        sender = endpoint(short_tmp)
        receiver = Endpoint("two#0", LAYOUT, ipc_addresses={})
        try:
            inbox = receiver.pull(f"ipc://{short_tmp}/inbox")
            assert inbox.getsockopt(zmq.LINGER) == 0
            publisher = sender.publisher(f"ipc://{short_tmp}/broadcast")
            broadcasts = receiver.broadcasts(f"ipc://{short_tmp}/broadcast")  # what a stage process reads
            control = sender.push(f"ipc://{short_tmp}/inbox")
            sender.send(control, skip("direct"))
            sender.flush()
            assert inbox.poll(5000) and received(inbox) == "direct"
            # a subscription takes a moment to reach the publisher: publish until one arrives
            first = asyncio.ensure_future(broadcasts.next())
            async with asyncio.timeout(5):
                while not first.done():
                    await publisher.send(m.encode(m.Abort(("r1",))))
                    await asyncio.wait({first}, timeout=0.01)
            assert m.broadcast_decoder.decode(first.result()) == m.Abort(("r1",))
            assert publisher.getsockopt(zmq.SNDHWM) == 0  # a slow reader is never dropped from
        finally:
            sender.close()
            receiver.close()

    on_loop(body)


def free_port() -> int:
    with socket_module.socket() as probe:  # bound, never listened on: free again once closed
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_bind_tcp_takes_the_port_asked_for_or_any_when_it_is_taken(short_tmp: Path) -> None:
    async def body() -> None:
        ep = endpoint(short_tmp)
        try:
            port = free_port()
            first = ep.bind_tcp(ep.pull(), "127.0.0.1", port)  # a restarted process asks for its old port
            assert first == f"tcp://127.0.0.1:{port}"
            taken = ep.bind_tcp(ep.pull(), "127.0.0.1", port)  # held by the first: another one
            assert taken.startswith("tcp://127.0.0.1:") and taken != first
            chosen = ep.bind_tcp(ep.pull(), "127.0.0.1")  # none asked for: the OS picks an ephemeral one
            assert chosen.startswith("tcp://127.0.0.1:") and int(chosen.rsplit(":", 1)[1]) >= 1024
            with pytest.raises(zmq.ZMQError):
                ep.bind_tcp(ep.pull(), "256.1.1.1")  # no port asked for: nothing to fall back to
        finally:
            ep.close()

    on_loop(body)


def test_with_the_launch_keys_tcp_sockets_serve_and_connect_over_curve(short_tmp: Path) -> None:
    keys = CurveKeys.generate()

    async def body() -> None:
        server = Endpoint("far", LAYOUT, ipc_addresses={}, node="box-b", curve=keys)
        client = endpoint(short_tmp, curve=keys)
        plain = endpoint(short_tmp)
        try:
            inbox = server.pull()
            address = server.bind_tcp(inbox, "127.0.0.1")
            assert inbox.getsockopt(zmq.CURVE_SERVER) == 1
            client.set_tcp_addresses({"far": address})
            assert client.peer("far").getsockopt(zmq.MECHANISM) == zmq.CURVE
            client.send_to("far", skip("with-the-keys"))
            client.flush()
            assert inbox.poll(5000) and received(inbox) == "with-the-keys"
            assert client.peer("two#0").getsockopt(zmq.MECHANISM) == zmq.NULL  # ipc: no CurveZMQ
            plain_pull = plain.pull()
            plain.bind_tcp(plain_pull, "127.0.0.1")
            assert plain_pull.getsockopt(zmq.MECHANISM) == zmq.NULL  # no keys: no CurveZMQ
        finally:
            for ep in (server, client, plain):
                ep.close()

    on_loop(body)


def test_a_tcp_address_learnt_for_a_peer_already_reached_over_ipc_keeps_that_socket(
    short_tmp: Path, peers: Peers
) -> None:
    two, address = peers.pull(f"ipc://{short_tmp}/two-0")

    async def body() -> None:
        ep = endpoint(short_tmp, ipc={"two#0": address})
        try:
            socket = ep.peer("two#0")
            ep.send_to("two#0", skip("queued-before-the-book"))
            ep.set_tcp_addresses({"two#0": "tcp://127.0.0.1:9"})  # the first book: nothing to reconnect
            assert ep.peer("two#0") is socket and not socket.closed
            ep.flush()
            assert received(two) == "queued-before-the-book"
        finally:
            ep.close()

    on_loop(body)
