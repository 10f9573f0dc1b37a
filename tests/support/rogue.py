"""A peer without a launch's CurveZMQ keys, against a running multi-node pipeline: it connects
to a worker's tcp data port and to the coordinator's broadcast, and must get nothing in and
nothing out while a request in flight completes unaffected. Shared by the local-launcher
tcp tests and the Ray tests (the same check under both launchers)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from omnictl import messages as m
from omnictl.topology.model import RelayKnobs
from omnictl.transports.shm import SlotPool
from omnictl.transports.tcp import TcpCodec
from tests.support.loop import LoopThread
from tests.support.stages import seen

_FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_AUTH}


def _handshakes(monitor: zmq.Socket, seconds: float, settle: float = 0.5) -> list[int]:
    """The socket's events until a handshake failed (plus ``settle`` seconds, to see any
    retry succeed) or ``seconds`` passed: generous, for a loaded machine, yet quick when refused."""
    events: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if monitor.poll(50):
            events.append(recv_monitor_message(monitor)["event"])
            if _FAILED & set(events):
                deadline = min(deadline, time.monotonic() + settle)
    return events


async def _result(pipeline: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return await (await pipeline.submit(inputs)).result()


def assert_a_peer_without_the_keys_gets_nothing(loop: LoopThread, pipeline: Any, log: Path, keys: str) -> None:
    """``pipeline``: the Qwen-shaped test topology with ``thinker`` taking tcp. ``keys``:
    ``none`` (a plain ZeroMQ socket) or ``server-key-but-own-client-key`` (knows the server's
    public key, but is not the launch's client)."""
    coordinator = pipeline._coordinator
    thinker = coordinator.endpoint.tcp_addresses["thinker"]
    broadcast = coordinator.wiring.tcp_coordinator[1]
    context = zmq.Context()
    rogue = context.socket(zmq.PUSH)
    listener = context.socket(zmq.SUB)
    listener.setsockopt(zmq.SUBSCRIBE, b"")
    if keys != "none":
        public, secret = zmq.curve_keypair()
        for socket in (rogue, listener):
            socket.setsockopt(zmq.CURVE_SERVERKEY, coordinator.wiring.curve.server_public)
            socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
    insider = context.socket(zmq.SUB)  # the control: with the launch's keys, broadcasts do arrive
    insider.setsockopt(zmq.SUBSCRIBE, b"")
    coordinator.wiring.curve.connect_as_client(insider)
    monitor = rogue.get_monitor_socket()
    try:
        in_flight = asyncio.run_coroutine_threadsafe(_result(pipeline, {"text": "steady", "tag": "inflight"}),
                                                     loop.loop)
        rogue.connect(thinker)
        listener.connect(broadcast)
        insider.connect(broadcast)
        forged, frames = TcpCodec(SlotPool("rogue", "x", 1024, 1), RelayKnobs()).encode_frames(
            {"tag": "forged", "ids": np.array([70, 71]), "emb": np.zeros((2, 3))})
        ctx = m.RequestContext("forged", {}, tuple(pipeline.topology.stages))
        message = m.encode(m.DataReady(ctx, "mm_aggregate", "thinker", forged, 0))
        rogue.send_multipart([message, *frames], copy=False)  # queued: never delivered
        events = _handshakes(monitor, 30)
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in events and _FAILED & set(events), events
        result = in_flight.result(120)
        assert result["decode"].text == "stead"  # unaffected (5 thinker steps)
        loop.run(pipeline.stats())  # broadcasts a stats request
        assert insider.poll(10_000) != 0  # it did go out (generous: a loaded machine)
        assert listener.poll(300) == 0  # and never reached the peer without the keys
        assert "forged" not in seen(log).get("thinker", [])
    finally:
        rogue.disable_monitor()
        for socket in (monitor, rogue, listener, insider):
            socket.close(linger=0)
        context.term()
