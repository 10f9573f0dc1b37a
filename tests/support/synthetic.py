"""Synthetic, plausible event streams for a request through a topology.

Used by tests and benchmarks to exercise spans, the waterfall, the Chrome export and the
dashboard without a running pipeline. The default topology is the 8-stage Qwen-Omni split
(two terminals: ``decode`` for text, ``code2wav`` for audio).
"""

from __future__ import annotations

import time
from collections import defaultdict

from omnictl.profiling.events import Event, EventKind, MetaValue
from omnictl.topology.derive import derive
from omnictl.topology.model import StageSpec, Topology

_MS = 1_000_000
_HOP_LATENCY_NS = {"inproc": 50_000, "shm": 300_000, "cuda_ipc": 200_000, "relay": 800_000}
_AUTOREGRESSIVE = {"thinker", "talker"}  # prefill + decode, and they stream


def qwen_omni_topology() -> Topology:
    """The article's 8-stage Qwen-Omni split on two GPUs (factories are placeholders)."""

    def stage(name: str, process: str, gpu: tuple[int, ...] = (), **fields: object) -> StageSpec:
        return StageSpec(name=name, factory=f"example.{name}", process=process, gpu=gpu, **fields)  # type: ignore[arg-type]

    encoders = ("audio_encoder", "image_encoder", "mm_aggregate")
    stages = [
        stage("preprocessing", "preprocess", next=encoders, route_fn="example.preprocessing_next"),
        stage("audio_encoder", "encoders", (0,), next=("mm_aggregate",)),
        stage("image_encoder", "encoders", (0,), next=("mm_aggregate",)),
        stage("mm_aggregate", "thinker", (0,), wait_for=("preprocessing", "audio_encoder", "image_encoder"),
              merge_fn="example.merge_for_thinker", next=("thinker",)),
        stage("thinker", "thinker", (0,), next=("decode", "talker"), stream_to=("talker", "decode")),
        stage("decode", "thinker", (0,), terminal=True, modality="text"),
        stage("talker", "talker", (1,), next=("code2wav",), stream_to=("code2wav",)),
        stage("code2wav", "talker", (1,), terminal=True, modality="audio"),
    ]
    return derive("qwen-omni", None, None, {s.name: s for s in stages})


def synthetic_request(
    request_id: str,
    topology: Topology | None = None,
    start_ns: int | None = None,
    chunks: int = 3,
    work_ms: float = 2.0,
) -> list[Event]:
    """One completed request's events, stage by stage, in a consistent timeline."""
    topology = topology if topology is not None else qwen_omni_topology()
    t0 = time.time_ns() if start_ns is None else start_ns
    events: list[Event] = []

    def emit(kind: EventKind, stage: str | None, ts: int, process: str | None = None, **meta: MetaValue) -> None:
        where = process if process is not None else topology.process_of(str(stage))
        events.append(Event(kind, request_id, stage, where, ts, meta))

    def transport(src: str, dst: str, kind: str = "data") -> str:
        return next(e.transport.value for e in topology.edges if (e.src, e.dst, e.kind.value) == (src, dst, kind))

    emit(EventKind.ADMITTED, None, t0, "coordinator")
    emit(EventKind.HOP_SENT, None, t0 + _MS // 10, "coordinator", target=topology.entry, bytes=4096, transport="shm")
    arrivals: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    arrivals[topology.entry].append(("coordinator", t0 + _MS // 10, "shm"))
    finished: list[int] = []
    firsts: dict[str, int] = {}
    for stage in _topological_order(topology):
        received = []
        for source, sent, via in arrivals[stage]:
            at = sent + _HOP_LATENCY_NS[via]
            emit(EventKind.HOP_RECEIVED, stage, at, source=source, transport=via)
            emit(EventKind.INPUT_RECEIVED, stage, at + 50_000, source=source, bytes=4096, transport=via)
            received.append(at + 50_000)
        ready = max(received)
        if topology.stages[stage].wait_for:
            emit(EventKind.FANIN_WAIT_START, stage, min(received))
            emit(EventKind.FANIN_WAIT_END, stage, ready)
        emit(EventKind.QUEUE_ENTER, stage, ready + 10_000)
        emit(EventKind.BUILD_START, stage, ready + 200_000, batch_size=1)
        built = ready + 200_000 + int(work_ms * _MS / 2)
        emit(EventKind.BUILD_END, stage, built)
        done = built + int(work_ms * _MS)
        if stage in _AUTOREGRESSIVE:
            emit(EventKind.PREFILL_START, stage, built)
            prefilled = built + int(work_ms * _MS)
            emit(EventKind.PREFILL_END, stage, prefilled)
            step = int(work_ms * _MS)
            for seq in range(chunks):
                sent = prefilled + (seq + 1) * step
                if seq == 0:
                    emit(EventKind.FIRST_EMIT, stage, sent)
                for target in topology.stages[stage].stream_to:
                    via = transport(stage, target, "stream")
                    emit(EventKind.STREAM_SENT, stage, sent, target=target, seq=seq, bytes=1024, transport=via)
                    got = sent + _HOP_LATENCY_NS[via]
                    emit(EventKind.STREAM_RECEIVED, target, got, source=stage, seq=seq)
                    if seq == 0 and topology.stages[target].terminal:
                        firsts.setdefault(target, got + int(work_ms * _MS))
            done = prefilled + (chunks + 1) * step
            emit(EventKind.DECODE_STEPS, stage, done - 10_000, steps=chunks * 4, seconds=chunks * step / 1e9)
        emit(EventKind.STAGE_DONE, stage, done)
        if topology.stages[stage].terminal:
            # The coordinator records these, naming the terminal stage.
            emit(EventKind.TERMINAL_COMPLETE, stage, done + 50_000, "coordinator")
            finished.append(done + 100_000)
        for target in topology.stages[stage].next:
            via = transport(stage, target)
            emit(EventKind.HOP_SENT, stage, done + 100_000, target=target, bytes=65536, transport=via)
            arrivals[target].append((stage, done + 100_000, via))
    for terminal, ts in firsts.items():
        first = EventKind.FIRST_TEXT if topology.terminals[terminal] == "text" else EventKind.FIRST_AUDIO
        emit(first, terminal, ts, "coordinator")
    emit(EventKind.COMPLETED, None, max(finished) + 100_000, "coordinator")
    return sorted(events, key=lambda e: e.ts)


def _topological_order(topology: Topology) -> list[str]:
    pending = {name: set(topology.upstreams(name)) for name in topology.stages}
    order: list[str] = []
    while pending:
        ready = [name for name, ups in pending.items() if not ups]
        if not ready:
            raise ValueError(f"topology {topology.name!r} has a cycle among {sorted(pending)}")
        for name in ready:
            order.append(name)
            del pending[name]
            for ups in pending.values():
                ups.discard(name)
    return order
