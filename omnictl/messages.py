"""Typed control-plane and data-plane messages (msgspec structs, tagged by kind).

Data-plane messages travel PUSH/PULL between stage processes and carry an
:class:`EncodedPayload` whose tensor bytes sit in shared memory (or inline when tiny).
Control messages to the coordinator never carry intermediate tensors: only terminal
results, which are the request's output.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

COORDINATOR = "coordinator"  # the owner name of buffers the coordinator sends (Submit)
# The ``src`` of a request's streamed input (StreamChunk / StreamDone to the entry stage, see
# :meth:`omnictl.coordinator.request.RequestHandle.send`): the caller's process, the one the
# coordinator runs in. Its profiler records under this name, so each chunk's sent and
# received events pair up as one hop; no stage can have it as an upstream (the entry has none).
INPUT_SOURCE = COORDINATOR
# The request param that resumes an autoregressive stream after a replica died: stage name ->
# the token ids its caller already received (forced as the continuation's prefix).
RESUME_PARAM = "resume"


class TensorLayout(msgspec.Struct, array_like=True, frozen=True):
    """Where one tensor leaf of the payload's data tree lives in the buffer."""

    index: int  # position of the leaf's marker in the skeleton
    kind: str  # "torch" | "numpy"
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class ShmRef(msgspec.Struct, array_like=True, frozen=True):
    """A buffer in a shared-memory segment owned by ``owner`` (a process name)."""

    owner: str
    stage: str  # the sending stage, whose pool owns the slot
    segment: str
    slot: int  # -1: a segment of its own (a payload larger than a slot)
    offset: int  # where the slot starts in the segment
    nbytes: int
    # Which use of the slot (or reused large segment) this is: a release that arrives late,
    # after the slot was taken back and lent again, names an older lease and is ignored.
    lease: int = 0


class EncodedPayload(msgspec.Struct, array_like=True):
    skeleton: bytes  # msgpack of the data tree, tensors replaced by markers
    layout: tuple[TensorLayout, ...] = ()
    inline: bytes = b""  # tensor bytes when they are tiny
    shm: ShmRef | None = None
    frames: bool = False  # tcp: tensor i is ZeroMQ frame i + 1 of the message (zero-copy)


def payload_bytes(payload: EncodedPayload) -> int:
    """How many bytes ``payload`` moves, however it travels (for the profiler's hops)."""
    framed = sum(entry.nbytes for entry in payload.layout) if payload.frames else 0
    return len(payload.skeleton) + len(payload.inline) + (payload.shm.nbytes if payload.shm else 0) + framed


class RequestContext(msgspec.Struct, array_like=True, frozen=True):
    """What every stage knows about a request besides its data."""

    request_id: str
    params: dict[str, Any]
    active: tuple[str, ...]  # stages that run for this request (modality pruning)
    # The replica of each replicated process this request runs on (process -> index),
    # chosen once at submit: every hop, chunk and fan-in part of the request goes there.
    replicas: dict[str, int] = msgspec.field(default_factory=dict)


# --- data plane: stage process <-> stage process -------------------------------------


class Submit(msgspec.Struct, tag="submit", array_like=True):
    ctx: RequestContext
    dst: str
    payload: EncodedPayload


class DataReady(msgspec.Struct, tag="data", array_like=True):
    ctx: RequestContext
    src: str
    dst: str
    payload: EncodedPayload
    sent_ns: int


class StreamChunk(msgspec.Struct, tag="chunk", array_like=True):
    ctx: RequestContext
    src: str
    dst: str
    seq: int
    payload: EncodedPayload
    sent_ns: int


class StreamDone(msgspec.Struct, tag="stream_done", array_like=True):
    ctx: RequestContext
    src: str
    dst: str


class Skip(msgspec.Struct, tag="skip", array_like=True):
    """``src`` will not send data to ``dst`` for this request (a route_fn left it out)."""

    ctx: RequestContext
    src: str
    dst: str


class SlotRelease(msgspec.Struct, tag="release", array_like=True):
    ref: ShmRef


# --- broadcast: coordinator -> every stage process (PUB/SUB) -------------------------


class Abort(msgspec.Struct, tag="abort", array_like=True):
    request_ids: tuple[str, ...]


class Hello(msgspec.Struct, tag="hello", array_like=True):
    seq: int
    # OS process (replica) -> its tcp:// PULL address; a process acks once it holds them all
    tcp_addresses: dict[str, str] = msgspec.field(default_factory=dict)


class StatsRequest(msgspec.Struct, tag="stats_request", array_like=True):
    seq: int


class ProcessLost(msgspec.Struct, tag="process_lost", array_like=True):
    """``process`` (an OS process, ``NAME#i`` for a replica) died: what was sent to it and
    not yet read will never be released by it (its senders take those slots back)."""

    process: str


# --- control plane: stage process -> coordinator -------------------------------------


class Ready(msgspec.Struct, tag="ready", array_like=True):
    process: str
    pid: int
    tcp_address: str = ""  # where it took tcp data (multi-node topologies), the port OS-chosen


class LaunchFailed(msgspec.Struct, tag="launch_failed", array_like=True):
    process: str
    stage: str
    error: str  # the formatted traceback


class HelloAck(msgspec.Struct, tag="hello_ack", array_like=True):
    process: str
    seq: int


class TerminalOutput(msgspec.Struct, tag="terminal", array_like=True):
    """A terminal stage's stream chunk (``final`` false) or result (``final`` true)."""

    request_id: str
    stage: str
    final: bool
    seq: int
    payload: EncodedPayload


class TerminalSkipped(msgspec.Struct, tag="terminal_skipped", array_like=True):
    request_id: str
    stage: str


class StageFailed(msgspec.Struct, tag="stage_failed", array_like=True):
    request_id: str
    stage: str
    error: str
    rejected: bool = False  # the stage could not take its input (vs. failed while working)
    field: str | None = None  # the request's field at fault: the input was bad (a 400, not a 500)


class StageStats(msgspec.Struct):
    requests: int = 0  # requests this stage holds any state for
    fanin_buffers: int = 0
    queued: int = 0
    running: int = 0
    stream_buffers: int = 0
    kv_slots: int = 0
    slots_in_use: int = 0  # shared-memory slots sent and not yet released
    busy_s: float = 0.0  # how long the stage's current compute step (one model call) has run; 0: idle
    # KV slots held by each follower rank of a tensor-parallel stage (rank 1, 2, ...); empty:
    # not one, or the group was in a step (it answers between steps only)
    rank_kv_slots: list[int] = msgspec.field(default_factory=list)


class InboxState(msgspec.Struct, tag="inbox", array_like=True):
    """A stage's inbox reached its limit (``full``) or has room again; the coordinator
    holds new requests at admission while any stage is full (backpressure)."""

    process: str  # the OS process (``tts#1`` for a replica)
    stage: str
    full: bool


class InputTaken(msgspec.Struct, tag="input_taken", array_like=True):
    """The entry stage's scheduler has taken ``taken`` chunks of the request's streamed input
    (``Pipeline.submit(..., input_stream=True)``) from its inbox: the caller's credit to send
    more (``RequestHandle.send`` waits while ``input_window`` chunks are not taken)."""

    process: str
    stage: str
    request_id: str  # the attempt's id, as the stages know it (the wire id)
    taken: int


class StatsReply(msgspec.Struct, tag="stats_reply", array_like=True):
    process: str
    seq: int
    stages: dict[str, StageStats]


StageInbound = Union[Submit, DataReady, StreamChunk, StreamDone, Skip, SlotRelease]
Broadcast = Union[Abort, Hello, StatsRequest, ProcessLost]
ToCoordinator = Union[
    Ready,
    LaunchFailed,
    HelloAck,
    TerminalOutput,
    TerminalSkipped,
    StageFailed,
    StatsReply,
    SlotRelease,
    InboxState,
    InputTaken,
]

_encoder = msgspec.msgpack.Encoder()
inbound_decoder = msgspec.msgpack.Decoder(StageInbound)
broadcast_decoder = msgspec.msgpack.Decoder(Broadcast)
coordinator_decoder = msgspec.msgpack.Decoder(ToCoordinator)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)
