"""A worker process's outputs: one path per derived transport.

``inproc`` hands the object to the co-located stage (no serialization); cross-process
edges encode with the sending stage's codec and PUSH a small message to the target
process. Control messages go to the coordinator. A peer on the same node is reached over
``ipc://``; one on another node (``tcp`` edges) over the ``tcp://`` address it reported, which
the coordinator hands out in its hellos.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

import zmq

from omnictl import messages as m
from omnictl.profiling.events import EventKind, Profiler, now_ns
from omnictl.topology.model import EdgeKind, RelayKnobs, Topology, Transport, replica_name
from omnictl.transports.codec import PayloadCodec, codec_for
from omnictl.transports.drain import Outgoing
from omnictl.transports.shm import SlotPool

if TYPE_CHECKING:
    from omnictl.stage.stage import Stage


def payload_bytes(payload: m.EncodedPayload) -> int:
    framed = sum(entry.nbytes for entry in payload.layout) if payload.frames else 0
    return len(payload.skeleton) + len(payload.inline) + (payload.shm.nbytes if payload.shm else 0) + framed


class WorkerPorts:
    def __init__(
        self,
        process: str,  # this replica's OS process name (``tts#1``): owner of its slots
        topology: Topology,
        zmq_context: zmq.Context,
        process_addresses: dict[str, str],
        coordinator_address: str,
        profiler: Profiler,
        node: str | None = None,  # this process's `node` label
        configure: Callable[[zmq.Socket], None] | None = None,  # e.g. CurveZMQ keys on tcp sockets
    ) -> None:
        self.process = process
        self.topology = topology
        self.profiler = profiler
        self.node = node
        self._configure = configure
        self.tcp_addresses: dict[str, str] = {}  # OS process -> tcp://, from the coordinator's hellos
        self._node_of = {name: p.node for p in topology.processes.values() for name in p.instances}
        self.local: dict[str, "Stage"] = {}  # filled by the worker once stages are built
        self._context = zmq_context
        self._addresses = process_addresses
        self._peers: dict[str, zmq.Socket] = {}
        self._coordinator = self._push(coordinator_address)
        self.pools: dict[str, SlotPool] = {}
        self._codecs: dict[tuple[str, Transport], PayloadCodec] = {}
        self._loop = asyncio.get_running_loop()
        self._out = Outgoing()  # several messages per send to each socket, per loop iteration

    def _push(self, address: str) -> zmq.Socket:
        socket = self._context.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)  # never block the event loop; memory is the bound
        socket.setsockopt(zmq.LINGER, 0)
        if address.startswith("tcp://") and self._configure is not None:
            self._configure(socket)
        socket.connect(address)
        return socket

    def _peer(self, process: str) -> zmq.Socket:
        socket = self._peers.get(process)
        if socket is None:
            if self._node_of.get(process, self.node) == self.node and process in self._addresses:
                address = self._addresses[process]
            elif process in self.tcp_addresses:
                address = self.tcp_addresses[process]
            else:
                raise LookupError(f"no tcp address for process {process!r} on node "
                                  f"{self._node_of.get(process)!r} yet (the coordinator sends them at start)")
            socket = self._peers[process] = self._push(address)
        return socket

    def set_tcp_addresses(self, addresses: dict[str, str]) -> None:
        """The coordinator's address book; a restarted peer may have a new port: reconnect to it."""
        for process, address in addresses.items():
            if self.tcp_addresses.get(process, address) != address and process in self._peers:
                self._close_peer(process)
            self.tcp_addresses[process] = address

    def _instance_of(self, ctx: m.RequestContext, dst: str) -> str:
        """The replica of ``dst``'s process that this request was assigned at submit."""
        process = self.topology.processes[self.topology.process_of(dst)]
        return replica_name(process.name, ctx.replicas.get(process.name, 0), process.replicas)

    def _peer_of(self, ctx: m.RequestContext, dst: str) -> zmq.Socket:
        return self._peer(self._instance_of(ctx, dst))

    def _send_payload(self, ctx: m.RequestContext, src: str, dst: str, payload: m.EncodedPayload,
                      message: m.StageInbound, frames: list[memoryview]) -> None:  # type: ignore[valid-type]
        instance = self._instance_of(ctx, dst)
        if payload.shm is not None:
            self.pool(src).sent(payload.shm, instance)  # taken back if that process dies before releasing it
        self._out.send(self._peer(instance), m.encode(message), frames)

    def lost(self, process: str) -> None:
        """The OS process ``process`` died: drop the socket to it (what is still queued
        there was for requests that failed with it) and take back the slots sent to it."""
        self._close_peer(process)
        for pool in self.pools.values():
            pool.reclaim(process)

    def _close_peer(self, process: str) -> None:
        socket = self._peers.pop(process, None)
        if socket is not None:
            self._out.discard(socket)
            socket.close(linger=0)

    def pool(self, stage: str) -> SlotPool:
        pool = self.pools.get(stage)
        if pool is None:
            knobs = self.topology.stages[stage].relay
            pool = self.pools[stage] = SlotPool(self.process, stage, knobs.slot_bytes, knobs.slots)
        return pool

    def _encode(self, stage: str, transport: Transport, data: Any) -> tuple[m.EncodedPayload, list[memoryview]]:
        codec = self._codecs.get((stage, transport))
        if codec is None:
            knobs: RelayKnobs = self.topology.stages[stage].relay
            codec = self._codecs[(stage, transport)] = codec_for(transport, self.pool(stage), knobs,
                                                                   self.topology.allow_pickle)
        return codec.encode_frames(data)

    def _signal(
        self, ctx: m.RequestContext, src: str, dst: str, kind: EdgeKind,
        local: Callable[["Stage"], None], remote: Callable[[], Any],
    ) -> None:
        """A payload-free message (stream done, skip) along an edge."""
        edge = self.topology.edge(src, dst, kind)
        if edge.transport is Transport.INPROC:
            # call_soon is FIFO: per-edge order holds and no stage re-enters another.
            self._loop.call_soon(local, self.local[dst])
        else:
            self._out.send(self._peer_of(ctx, dst), m.encode(remote()))

    # --- Ports protocol ---------------------------------------------------------------

    def send_data(self, ctx: m.RequestContext, src: str, dst: str, data: Any) -> None:
        edge = self.topology.edge(src, dst, EdgeKind.DATA)
        sent = now_ns()
        if edge.transport is Transport.INPROC:
            self.profiler.record(EventKind.HOP_SENT, ctx.request_id, src, target=dst, transport="inproc", bytes=0)
            self._loop.call_soon(self._receive_local, self.local[dst], ctx, src, data)
            return
        payload, frames = self._encode(src, edge.transport, data)
        self.profiler.record(
            EventKind.HOP_SENT, ctx.request_id, src, target=dst, transport=edge.transport.value, bytes=payload_bytes(payload)
        )
        self._send_payload(ctx, src, dst, payload, m.DataReady(ctx, src, dst, payload, sent), frames)

    def _receive_local(self, stage: "Stage", ctx: m.RequestContext, src: str, data: Any) -> None:
        self.profiler.record(EventKind.HOP_RECEIVED, ctx.request_id, stage.name, source=src, transport="inproc")
        stage.on_input(ctx, src, data)

    def send_stream(self, ctx: m.RequestContext, src: str, dst: str, seq: int, data: Any) -> None:
        edge = self.topology.edge(src, dst, EdgeKind.STREAM)
        self.profiler.record(EventKind.STREAM_SENT, ctx.request_id, src, target=dst, seq=seq, transport=edge.transport.value)
        if edge.transport is Transport.INPROC:
            self._loop.call_soon(self.local[dst].on_stream_chunk, ctx, src, seq, data)
            return
        payload, frames = self._encode(src, edge.transport, data)
        self._send_payload(ctx, src, dst, payload, m.StreamChunk(ctx, src, dst, seq, payload, now_ns()), frames)

    def send_stream_done(self, ctx: m.RequestContext, src: str, dst: str) -> None:
        self._signal(ctx, src, dst, EdgeKind.STREAM, lambda s: s.on_stream_done(ctx, src), lambda: m.StreamDone(ctx, src, dst))

    def send_skip(self, ctx: m.RequestContext, src: str, dst: str) -> None:
        self._signal(ctx, src, dst, EdgeKind.DATA, lambda s: s.on_skip(ctx, src), lambda: m.Skip(ctx, src, dst))

    def send_terminal(self, request_id: str, stage: str, final: bool, seq: int, data: Any) -> None:
        # the coordinator runs on the unlabelled node: from any other, terminal outputs go over tcp
        payload, frames = self._encode(stage, Transport.SHM if self.node is None else Transport.TCP, data)
        self._out.send(self._coordinator, m.encode(m.TerminalOutput(request_id, stage, final, seq, payload)), frames)

    def send_terminal_skipped(self, request_id: str, stage: str) -> None:
        self._out.send(self._coordinator, m.encode(m.TerminalSkipped(request_id, stage)))

    def send_failure(self, request_id: str, stage: str, error: str, rejected: bool = False, field: str | None = None) -> None:
        self._out.send(self._coordinator, m.encode(m.StageFailed(request_id, stage, error, rejected, field)))

    def send_control(self, message: m.ToCoordinator) -> None:  # type: ignore[valid-type]
        self._out.send(self._coordinator, m.encode(message))

    def release(self, ref: m.ShmRef) -> None:
        """Hand a slot back to its owner (after unpacking what it held)."""
        if ref.owner == self.process:
            self.pool(ref.stage).release(ref)
        elif ref.owner == m.COORDINATOR:
            self._out.send(self._coordinator, m.encode(m.SlotRelease(ref)))
        else:
            self._out.send(self._peer(ref.owner), m.encode(m.SlotRelease(ref)))

    def flush(self) -> None:
        """Send now what is queued (messages otherwise leave at the end of the loop iteration)."""
        self._out.flush()

    def close(self, linger_ms: int = 0) -> None:
        """``linger_ms``: how long queued messages may still go out (a launch failure must)."""
        self._out.flush()
        for pool in self.pools.values():
            pool.close()
        for socket in [*self._peers.values(), self._coordinator]:
            socket.close(linger=linger_ms)
