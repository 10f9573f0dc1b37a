"""A worker's ports alone: each output goes down its edge's transport. Real ZeroMQ over
ipc:// sockets in a temporary directory stands in for the peer process and the
coordinator; co-located stages are test doubles that record what they are handed."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import numpy as np
import pytest
import zmq

from omnictl import messages as m
from omnictl.profiling.events import EventKind
from omnictl.stage.ports import WorkerPorts, payload_bytes
from omnictl.topology import loads
from omnictl.topology.model import EdgeKind, Transport
from omnictl.transports.codec import decode
from omnictl.transports.endpoint import Endpoint
from omnictl.transports.shm import SegmentReader
from tests.support.profiler import RecordingProfiler
from tests.support.wait import eventually, run

# a -> b in the same process (inproc); a -> c in another one; data and stream edges to both.
TOPOLOGY = loads("""
stages:
  - name: a
    factory: m.a
    process: one
    next: [b, c]
    stream_to: [b, c]
  - name: b
    factory: m.b
    process: one
    terminal: true
    modality: text
  - name: c
    factory: m.c
    process: two
    terminal: true
    modality: audio
""", "t.yaml")
CTX = m.RequestContext("r", {"voice": "v"}, ("a", "b", "c"))


class LocalStage:
    """A co-located stage: records each call it gets."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = []

    def on_input(self, ctx: m.RequestContext, source: str, data: Any) -> None:
        self.calls.append(("input", ctx.request_id, source, data))

    def on_skip(self, ctx: m.RequestContext, source: str) -> None:
        self.calls.append(("skip", ctx.request_id, source))

    def on_stream_chunk(self, ctx: m.RequestContext, source: str, seq: int, data: Any) -> None:
        self.calls.append(("chunk", ctx.request_id, source, seq, data))

    def on_stream_done(self, ctx: m.RequestContext, source: str) -> None:
        self.calls.append(("stream_done", ctx.request_id, source))


class Wired:
    """WorkerPorts of process ``one``, the PULL sockets of process ``two`` and the coordinator."""

    def __init__(self, tmp: Path, topology: Any = TOPOLOGY, others: dict[str, str] | None = None) -> None:
        self.context = zmq.Context()
        self.addresses = {"one": f"ipc://{tmp}/one", "two": f"ipc://{tmp}/two", **(others or {})}
        self.two = self._pull(self.addresses["two"])
        self.coordinator = self._pull(f"ipc://{tmp}/coordinator")
        self.profiler = RecordingProfiler()
        self.endpoint = Endpoint("one", topology.wire_layout(), ipc_addresses=self.addresses)
        self.ports = WorkerPorts(self.endpoint, topology, f"ipc://{tmp}/coordinator", self.profiler)  # type: ignore[arg-type]
        self.b = LocalStage("b")
        self.ports.local = {"b": self.b}  # type: ignore[dict-item]
        self.reader = SegmentReader()

    def _pull(self, address: str) -> zmq.Socket:
        socket = self.context.socket(zmq.PULL)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, 5000)  # a missing message fails the test, it does not hang it
        socket.bind(address)
        return socket

    def at_two(self) -> Any:
        self.ports.flush()  # sends leave at the end of the loop iteration; this test blocks the loop
        return m.inbound_decoder.decode(self.two.recv())

    def at_coordinator(self) -> Any:
        self.ports.flush()
        return m.coordinator_decoder.decode(self.coordinator.recv())

    def close(self) -> None:
        self.endpoint.close()
        self.reader.close()
        self.two.close()
        self.coordinator.close()
        self.context.term()


def wired(tmp_path: Path, body: Callable[[Wired], Awaitable[None]], topology: Any = TOPOLOGY,
          others: dict[str, str] | None = None) -> None:
    """``others``: more OS processes' addresses (their sockets are the test's)."""
    async def go() -> None:
        w = Wired(tmp_path, topology, others)  # the ports need the running loop
        try:
            await body(w)
        finally:
            w.close()

    run(go, timeout=10)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # ipc:// paths must stay short (about 100 bytes): pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="omx-ports-") as tmp:
        yield Path(tmp)


def test_data_to_a_co_located_stage_is_the_object_itself_handed_over_on_the_loop(short_tmp: Path) -> None:
    data = {"ids": [1, 2]}

    async def body(w: Wired) -> None:
        w.ports.send_data(CTX, "a", "b", data)
        assert w.b.calls == []  # handed over on the loop, not re-entering b from inside a
        await eventually(lambda: bool(w.b.calls))
        assert w.b.calls == [("input", "r", "a", data)] and w.b.calls[0][3] is data
        assert w.profiler.events == [
            (EventKind.HOP_SENT, "r", "a", {"target": "b", "transport": "inproc", "bytes": 0}),
            (EventKind.HOP_RECEIVED, "r", "b", {"source": "a", "transport": "inproc"}),
        ]

    wired(short_tmp, body)


def test_signals_to_a_co_located_stage_keep_their_order(short_tmp: Path) -> None:
    async def body(w: Wired) -> None:
        w.ports.send_skip(CTX, "a", "b")
        w.ports.send_data(CTX, "a", "b", 1)
        await eventually(lambda: len(w.b.calls) == 2)
        assert w.b.calls == [("skip", "r", "a"), ("input", "r", "a", 1)]

    wired(short_tmp, body)


def test_a_stream_to_a_co_located_stage_is_handed_over_chunk_by_chunk_then_done(short_tmp: Path) -> None:
    chunk = {"t": [1]}

    async def body(w: Wired) -> None:
        w.ports.send_stream(CTX, "a", "b", 0, chunk)
        w.ports.send_stream(CTX, "a", "b", 1, {"t": [2]})
        w.ports.send_stream_done(CTX, "a", "b")
        await eventually(lambda: len(w.b.calls) == 3)
        assert w.b.calls == [("chunk", "r", "a", 0, chunk), ("chunk", "r", "a", 1, {"t": [2]}), ("stream_done", "r", "a")]
        assert w.b.calls[0][4] is chunk
        assert [meta for _, _, _, meta in w.profiler.events] == [
            {"target": "b", "seq": 0, "transport": "inproc"}, {"target": "b", "seq": 1, "transport": "inproc"}]

    wired(short_tmp, body)


def test_a_small_payload_rides_inline_and_its_bytes_are_counted_exactly(short_tmp: Path) -> None:
    async def body(w: Wired) -> None:
        w.ports.send_data(CTX, "a", "c", {"ids": np.arange(4, dtype=np.int64)})
        message = w.at_two()
        inline = len(message.payload.inline)  # the 32 bytes, padded to the tensor alignment
        assert message.payload.shm is None and 32 <= inline < 1024
        assert payload_bytes(message.payload) == len(message.payload.skeleton) + inline
        assert w.profiler.events[0][3]["bytes"] == payload_bytes(message.payload)

    wired(short_tmp, body)


def test_data_to_another_process_is_encoded_and_pushed_to_it(short_tmp: Path) -> None:
    blob = np.arange(50_000, dtype=np.float32)  # over the inline threshold: a shared-memory slot

    async def body(w: Wired) -> None:
        w.ports.send_data(CTX, "a", "c", {"blob": blob, "n": 3})
        message = w.at_two()
        assert isinstance(message, m.DataReady)
        assert (message.ctx, message.src, message.dst) == (CTX, "a", "c") and message.sent_ns > 0
        assert message.payload.shm is not None and message.payload.shm.owner == "one"
        out = decode(message.payload, w.reader)
        assert out["n"] == 3 and np.array_equal(out["blob"], blob)
        [(kind, rid, stage, meta)] = w.profiler.events
        edge = TOPOLOGY.edge("a", "c")
        assert edge.transport is not Transport.INPROC
        assert (kind, rid, stage) == (EventKind.HOP_SENT, "r", "a")
        assert meta == {"target": "c", "transport": edge.transport.value, "bytes": payload_bytes(message.payload)}
        assert meta["bytes"] >= blob.nbytes
        assert w.ports.pools["a"].in_use == 1
        # The receiver hands the slot back: it returns to a's pool.
        w.ports.release(message.payload.shm)
        assert w.ports.pools["a"].in_use == 0

    wired(short_tmp, body)


def test_stream_chunks_done_and_skips_to_another_process(short_tmp: Path) -> None:
    async def body(w: Wired) -> None:
        w.ports.send_stream(CTX, "a", "c", 4, {"t": "hi"})
        w.ports.send_stream_done(CTX, "a", "c")
        w.ports.send_skip(CTX, "a", "c")
        chunk, done, skip = w.at_two(), w.at_two(), w.at_two()
        assert isinstance(chunk, m.StreamChunk) and (chunk.ctx, chunk.src, chunk.dst, chunk.seq) == (CTX, "a", "c", 4)
        assert decode(chunk.payload, w.reader) == {"t": "hi"}
        assert done == m.StreamDone(CTX, "a", "c") and skip == m.Skip(CTX, "a", "c")
        assert w.profiler.events == [(EventKind.STREAM_SENT, "r", "a",
                                      {"target": "c", "seq": 4, "transport": TOPOLOGY.edge("a", "c", EdgeKind.STREAM).transport.value})]

    wired(short_tmp, body)


def test_terminal_outputs_skips_and_failures_go_to_the_coordinator(short_tmp: Path) -> None:
    async def body(w: Wired) -> None:
        w.ports.send_terminal("r", "b", False, 0, {"text": "Hi"})
        w.ports.send_terminal("r", "b", True, 1, {"text": "Hi there"})
        w.ports.send_terminal_skipped("q", "b")
        w.ports.send_failure("x", "b", "stage 'b' failed: boom")
        w.ports.send_control(m.Ready("one", 42))
        chunk, final, skipped, failed, ready = (w.at_coordinator() for _ in range(5))
        assert (chunk.request_id, chunk.stage, chunk.final, chunk.seq) == ("r", "b", False, 0)
        assert decode(chunk.payload, w.reader) == {"text": "Hi"}
        assert (final.final, final.seq, decode(final.payload, w.reader)) == (True, 1, {"text": "Hi there"})
        assert skipped == m.TerminalSkipped("q", "b")
        assert failed == m.StageFailed("x", "b", "stage 'b' failed: boom")
        assert ready == m.Ready("one", 42)

    wired(short_tmp, body)


def test_a_slot_another_process_owns_is_released_to_its_owner(short_tmp: Path) -> None:
    theirs = m.ShmRef("two", "c", "omxseg", 0, 0, 16)
    coordinators = m.ShmRef(m.COORDINATOR, "entry", "omxseg2", 1, 64, 16)

    async def body(w: Wired) -> None:
        w.ports.release(theirs)
        w.ports.release(coordinators)
        assert w.at_two() == m.SlotRelease(theirs)
        assert w.at_coordinator() == m.SlotRelease(coordinators)

    wired(short_tmp, body)


# a streams to d without a data edge to it: signals along the stream edge must find it
STREAM_ONLY = loads("""
stages:
  - {name: a, factory: m.a, process: one, next: [c], stream_to: [d]}
  - {name: c, factory: m.c, process: one, terminal: true, modality: text}
  - {name: d, factory: m.d, process: two, terminal: true, modality: audio}
""", "s.yaml")


def test_a_failure_reaches_the_coordinator_with_the_field_at_fault_and_whether_the_input_was_refused(
        short_tmp: Path) -> None:
    async def body(w: Wired) -> None:
        w.ports.send_failure("x", "b", "messages[0]: must be text", rejected=True, field="messages[0]")
        assert w.at_coordinator() == m.StageFailed("x", "b", "messages[0]: must be text", True, "messages[0]")

    wired(short_tmp, body)


def test_a_stream_chunk_in_shared_memory_is_taken_back_when_its_receiver_dies(short_tmp: Path) -> None:
    blob = np.arange(50_000, dtype=np.float32)  # over the inline threshold: a slot of a's pool

    async def body(w: Wired) -> None:
        w.ports.send_stream(CTX, "a", "c", 0, {"blob": blob})
        chunk = w.at_two()
        assert chunk.payload.shm is not None and w.ports.pools["a"].in_use == 1
        w.ports.lost("two")  # it never releases the slot: the sender takes it back
        assert w.ports.pools["a"].in_use == 0

    wired(short_tmp, body)


def test_a_stream_edge_with_no_data_edge_beside_it_carries_chunks_and_done(short_tmp: Path) -> None:
    ctx = m.RequestContext("r", {}, ("a", "c", "d"))

    async def body(w: Wired) -> None:
        w.ports.send_stream(ctx, "a", "d", 0, {"t": "hi"})
        w.ports.send_stream_done(ctx, "a", "d")
        chunk, done = w.at_two(), w.at_two()
        assert isinstance(chunk, m.StreamChunk) and decode(chunk.payload, w.reader) == {"t": "hi"}
        assert done == m.StreamDone(ctx, "a", "d")

    wired(short_tmp, body, STREAM_ONLY)


def test_data_in_shared_memory_is_taken_back_when_its_receiver_dies(short_tmp: Path) -> None:
    blob = np.arange(50_000, dtype=np.float32)

    async def body(w: Wired) -> None:
        w.ports.send_data(CTX, "a", "c", {"blob": blob})
        assert w.at_two().payload.shm is not None and w.ports.pools["a"].in_use == 1
        w.ports.lost("two")
        assert w.ports.pools["a"].in_use == 0

    wired(short_tmp, body)


# c's process has two replicas: a request goes to the one its context names, else the first
REPLICATED = loads("""
stages:
  - {name: a, factory: m.a, process: one, next: [c]}
  - {name: c, factory: m.c, process: two, terminal: true, modality: text}
processes:
  two: {replicas: 2}
""", "r.yaml")


@pytest.mark.parametrize(("replicas", "receiver"), [({"two": 1}, "two#1"), ({"two": 0}, "two#0"), ({}, "two#0")])
def test_data_goes_to_the_replica_the_request_is_pinned_to(short_tmp: Path, replicas: dict[str, int],
                                                         receiver: str) -> None:
    ctx = m.RequestContext("r", {}, ("a", "c"), replicas)
    context = zmq.Context()
    addresses = {name: f"ipc://{short_tmp}/{name.replace('#', '-')}" for name in ("two#0", "two#1")}
    sockets = {}
    for name, address in addresses.items():
        sockets[name] = context.socket(zmq.PULL)
        sockets[name].setsockopt(zmq.LINGER, 0)
        sockets[name].bind(address)

    async def body(w: Wired) -> None:
        w.ports.send_data(ctx, "a", "c", {"n": 1})
        w.ports.flush()
        # the pinned replica first, waiting for the data; then the other, briefly: a copy sent
        # there too went out at the same moment, so it is there by then
        ready = [name for name in sorted(sockets, key=lambda name: name != receiver)
                 if sockets[name].poll(2000 if name == receiver else 200)]
        assert ready == [receiver]

    try:
        wired(short_tmp, body, REPLICATED, addresses)
    finally:
        for socket in sockets.values():
            socket.close()
        context.term()
