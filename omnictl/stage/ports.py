"""A worker process's outputs: one path per derived transport.

``inproc`` hands the object to the co-located stage (no serialization); cross-process
edges encode with the sending stage's codec and PUSH a small message to the target
process's replica the request was placed on. Control messages go to the coordinator. The
sockets, peers, slot pools and codecs are the process's :class:`~omnictl.transports.
endpoint.Endpoint`'s; this module only decides what goes where.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from omnictl import messages as m
from omnictl.profiling.events import EventKind, Profiler, now_ns
from omnictl.topology.model import EdgeKind, Topology, Transport, replica_name
from omnictl.transports import registry
from omnictl.transports.endpoint import Endpoint
from omnictl.transports.registry import Placement
from omnictl.transports.shm import SlotPool

if TYPE_CHECKING:
    from omnictl.stage.stage import Stage


payload_bytes = m.payload_bytes  # where it was first defined: the tests and callers import it from here


class WorkerPorts:
    """What a stage process's stages send, by edge; the sockets are its :class:`Endpoint`'s."""

    def __init__(self, endpoint: Endpoint, topology: Topology, coordinator_address: str, profiler: Profiler) -> None:
        self.endpoint = endpoint
        self.process = endpoint.owner  # this replica's OS process name (``tts#1``): owner of its slots
        self.topology = topology
        self.profiler = profiler
        self.node = endpoint.node
        self.local: dict[str, Stage] = {}  # filled by the worker once stages are built
        self._coordinator = endpoint.push(coordinator_address)
        # as if an edge to a CPU stage of the coordinator's process, on the unlabelled node
        self._to_coordinator = registry.select(Placement(False, self.node, None))
        self._loop = asyncio.get_running_loop()

    @property
    def pools(self) -> dict[str, SlotPool]:
        return self.endpoint.pools

    def set_tcp_addresses(self, addresses: dict[str, str]) -> None:
        """The coordinator's address book; a restarted peer may have a new port: reconnect to it."""
        self.endpoint.set_tcp_addresses(addresses)

    def _instance_of(self, ctx: m.RequestContext, dst: str) -> str:
        """The replica of ``dst``'s process that this request was assigned at submit."""
        process = self.topology.processes[self.topology.process_of(dst)]
        return replica_name(process.name, ctx.replicas.get(process.name, 0), process.replicas)

    def _send_payload(
        self,
        ctx: m.RequestContext,
        src: str,
        dst: str,
        payload: m.EncodedPayload,
        message: m.StageInbound,
        frames: list[memoryview],
    ) -> None:
        self.endpoint.send_to(self._instance_of(ctx, dst), message, frames, payload, lender=src)

    def lost(self, process: str) -> None:
        """The OS process ``process`` died: drop the socket to it (what is still queued
        there was for requests that failed with it) and take back the slots sent to it."""
        self.endpoint.lost(process)

    def pool(self, stage: str) -> SlotPool:
        return self.endpoint.pool(stage)

    def _encode(self, stage: str, transport: Transport, data: Any) -> tuple[m.EncodedPayload, list[memoryview]]:
        return self.endpoint.codec(stage, transport).encode_frames(data)

    def _signal(
        self,
        ctx: m.RequestContext,
        src: str,
        dst: str,
        kind: EdgeKind,
        local: Callable[[Stage], None],
        remote: Callable[[], Any],
    ) -> None:
        """A payload-free message (stream done, skip) along an edge."""
        edge = self.topology.edge(src, dst, kind)
        if edge.transport is Transport.INPROC:
            # call_soon is FIFO: per-edge order holds and no stage re-enters another.
            self._loop.call_soon(local, self.local[dst])
        else:
            self.endpoint.send_to(self._instance_of(ctx, dst), remote())

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
            EventKind.HOP_SENT,
            ctx.request_id,
            src,
            target=dst,
            transport=edge.transport.value,
            bytes=payload_bytes(payload),
        )
        self._send_payload(ctx, src, dst, payload, m.DataReady(ctx, src, dst, payload, sent), frames)

    def _receive_local(self, stage: Stage, ctx: m.RequestContext, src: str, data: Any) -> None:
        self.profiler.record(EventKind.HOP_RECEIVED, ctx.request_id, stage.name, source=src, transport="inproc")
        stage.on_input(ctx, src, data)

    def send_stream(self, ctx: m.RequestContext, src: str, dst: str, seq: int, data: Any) -> None:
        edge = self.topology.edge(src, dst, EdgeKind.STREAM)
        self.profiler.record(
            EventKind.STREAM_SENT, ctx.request_id, src, target=dst, seq=seq, transport=edge.transport.value
        )
        if edge.transport is Transport.INPROC:
            self._loop.call_soon(self.local[dst].on_stream_chunk, ctx, src, seq, data)
            return
        payload, frames = self._encode(src, edge.transport, data)
        self._send_payload(ctx, src, dst, payload, m.StreamChunk(ctx, src, dst, seq, payload, now_ns()), frames)

    def send_stream_done(self, ctx: m.RequestContext, src: str, dst: str) -> None:
        self._signal(
            ctx, src, dst, EdgeKind.STREAM, lambda s: s.on_stream_done(ctx, src), lambda: m.StreamDone(ctx, src, dst)
        )

    def send_skip(self, ctx: m.RequestContext, src: str, dst: str) -> None:
        self._signal(ctx, src, dst, EdgeKind.DATA, lambda s: s.on_skip(ctx, src), lambda: m.Skip(ctx, src, dst))

    def send_terminal(self, request_id: str, stage: str, final: bool, seq: int, data: Any) -> None:
        # the coordinator runs on the unlabelled node: from any other, terminal outputs go over tcp
        payload, frames = self._encode(stage, self._to_coordinator, data)
        self.endpoint.send(self._coordinator, m.TerminalOutput(request_id, stage, final, seq, payload), frames)

    def send_terminal_skipped(self, request_id: str, stage: str) -> None:
        self.endpoint.send(self._coordinator, m.TerminalSkipped(request_id, stage))

    def send_failure(
        self, request_id: str, stage: str, error: str, rejected: bool = False, field: str | None = None
    ) -> None:
        self.endpoint.send(self._coordinator, m.StageFailed(request_id, stage, error, rejected, field))

    def send_control(self, message: m.ToCoordinator) -> None:
        self.endpoint.send(self._coordinator, message)

    def release(self, ref: m.ShmRef) -> None:
        """Hand a slot back to its owner (after unpacking what it held)."""
        if ref.owner == self.process:
            self.pool(ref.stage).release(ref)
        elif ref.owner == m.COORDINATOR:
            self.endpoint.send(self._coordinator, m.SlotRelease(ref))
        else:
            self.endpoint.send_to(ref.owner, m.SlotRelease(ref))

    def flush(self) -> None:
        """Send now what is queued (messages otherwise leave at the end of the loop iteration)."""
        self.endpoint.flush()
