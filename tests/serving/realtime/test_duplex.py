"""``/v1/realtime`` in full-duplex mode (omnictl/serving/realtime/duplex.py): topologies/moshi.yaml
and the tiny Moshi checkpoint behind a real in-process ``omnictl serve``, a real WebSocket client."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from websockets.sync.client import ClientConnection, connect

from omnictl.audio.pcm import float_to_pcm16_bytes
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.config import HttpConfig, ServeConfig
from omnictl.serving.server import Listening
from tests.models.conftest import tiny_moshi  # noqa: F401  (the fixture, shared)
from tests.models.mimi.conftest import speechlike
from tests.serving.harness import serving_in_process
from tests.support.held import held_by

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a real serve of the tiny model, launched once

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "moshi.yaml"
CHUNK = 2_400  # 100 ms at 24 kHz


@pytest.fixture(scope="module")
def served(tiny_moshi: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listening]:  # noqa: F811
    config = ServeConfig(topology=str(TOPOLOGY), http=HttpConfig(port=0)).launching(
        model_path=str(tiny_moshi), device="cpu", run_dir=tmp_path_factory.mktemp("moshi-run")
    )
    with serving_in_process(config, "in-process omnictl serve (moshi)") as listening:
        yield listening


def socket(served: Listening) -> ClientConnection:
    return connect(served.url.replace("http", "ws", 1) + "/v1/realtime", open_timeout=30, max_size=None)


def receive(ws: ClientConnection, timeout: float = 120.0) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=timeout)))


def append(ws: ClientConnection, samples: np.ndarray) -> None:
    for at in range(0, len(samples), CHUNK):
        audio = base64.b64encode(float_to_pcm16_bytes(samples[at : at + CHUNK])).decode()
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind``."""
    seen = []
    while True:
        seen.append(receive(ws))
        if seen[-1]["type"] == kind:
            return seen


def test_a_duplex_session_streams_a_frame_of_audio_per_80_ms_of_input_and_ends_on_commit(served: Listening) -> None:
    with socket(served) as ws:
        created = receive(ws)
        assert created["type"] == "session.created" and created["session"]["mode"] == "full_duplex"
        assert created["session"]["audio"]["input"]["turn_detection"] is None
        # Turn-taking events have no meaning here: refused by name, the session goes on.
        ws.send(json.dumps({"type": "response.create", "event_id": "e1"}))
        refused = receive(ws)
        assert refused["type"] == "error" and refused["error"]["code"] == "unsupported_in_full_duplex"
        assert refused["error"]["event_id"] == "e1"
        ws.send(
            json.dumps(
                {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}
            )
        )
        assert receive(ws)["error"]["param"] == "session.audio.input.turn_detection"
        append(ws, speechlike(3.0, seed=4))  # 37 whole frames and 40 ms over
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = until(ws, "response.done")
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.output_item.added", "response.content_part.added"]
    audio = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
    assert len(audio) == 37 and all(len(delta) == 1920 * 2 for delta in audio)  # 80 ms of PCM16 each
    said = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"] == said
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == said
    assert kinds.index("response.output_audio.done") > max(i for i, k in enumerate(kinds) if k.endswith(".delta"))


def test_a_client_that_cancels_or_disconnects_mid_session_leaves_nothing(served: Listening) -> None:
    with socket(served) as ws:
        assert receive(ws)["type"] == "session.created"
        append(ws, speechlike(4.0, seed=5))
        until(ws, "response.output_audio.delta")
        ws.send(json.dumps({"type": "response.cancel"}))
        assert until(ws, "response.done")[-1]["response"]["status"] == "cancelled"
        append(ws, speechlike(4.0, seed=7))  # a new response, which the client walks away from
        until(ws, "response.output_audio.delta")  # Moshi is speaking: the client goes away
    assert served.loop is not None
    held = asyncio.run_coroutine_threadsafe(held_by(served.pipeline), served.loop).result(60)
    assert held == []


def test_a_chat_completion_is_refused_naming_how_to_stream(served: Listening) -> None:
    """Its input never arrives whole: /v1/realtime is the route (capabilities list no chat)."""
    chat = {"model": "moshi", "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(served.url + "/v1/chat/completions", json=chat, timeout=60)
    assert reply.status_code == 400 and "/v1/realtime" in reply.text
    assert capabilities(served.pipeline.topology).endpoints() == ["/v1/realtime"]


def test_a_webrtc_call_is_a_duplex_session_on_the_call_tracks(
    served: Listening, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The microphone track is the input; Moshi's audio comes on the call's track (never as delta
    events); commit ends the response; the call hung up leaves nothing."""
    import aioice.ice

    from tests.serving.realtime.rtc import Call, loopback_only

    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)  # restored after
    loopback_only()

    async def scenario() -> list[dict[str, Any]]:
        call = Call()
        try:
            answer = await call.dial(served.url, None, query="?model=moshi")
            assert answer.status_code == 201, answer.text
            await call.opened()
            created = await call.next_of("session.created")
            assert created["session"]["mode"] == "full_duplex"
            call.mic.say(float_to_pcm16_bytes(speechlike(2.0, seed=6)))
            await call.next_of("output_audio_buffer.started")  # Moshi speaks on the track while it listens
            await call.mic.done.wait()
            call.send({"type": "input_audio_buffer.commit"})
            done = await call.next_of("response.done")
            assert done["response"]["status"] == "completed"
            await call.next_of("output_audio_buffer.stopped")
            return list(call.events)
        finally:
            await call.close()

    events = asyncio.run(asyncio.wait_for(scenario(), 180))
    kinds = [e["type"] for e in events]
    assert "response.output_audio.delta" not in kinds and "response.created" in kinds
    assert served.loop is not None
    held = asyncio.run_coroutine_threadsafe(held_by(served.pipeline), served.loop).result(60)
    assert held == []
