"""An aiortc client of ``POST /v1/realtime/calls``, as a browser would be one: a microphone
track that plays given audio in real time (then silence), the answer track recorded, the
``oai-events`` data channel's events collected. ICE stays on 127.0.0.1: no STUN server, and
the client gathers only a loopback candidate (the server does too: it is bound to loopback)."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from omnictl.inputs import PCM16_RATE

RATE = 48_000  # what a browser's microphone track carries
FRAME = RATE // 50  # 20 ms


def loopback_only() -> None:
    """aioice skips 127.0.0.1 when it gathers: make it gather only that, in this process."""
    import aioice.ice

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []


class Microphone(MediaStreamTrack):
    """pcm16 at 24 kHz, sent as 48 kHz 20 ms frames in real time once ``start`` is called; silence before and after."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pcm = np.zeros(0, dtype="<i2")
        self._at = 0
        self._start: float | None = None
        self._sent = 0
        self.done = asyncio.Event()

    def say(self, pcm24: bytes) -> None:
        samples = np.frombuffer(pcm24, "<i2").astype(np.float32)
        self._pcm = np.repeat(samples, 2).astype("<i2")  # 24 -> 48 kHz (the server resamples it back)
        self._at = 0
        self.done.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._sent / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = self._pcm[self._at : self._at + FRAME]
        self._at += len(chunk)
        if self._at >= len(self._pcm):
            self.done.set()
        chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), dtype="<i2")])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._sent, fractions.Fraction(1, RATE)
        self._sent += FRAME
        return frame


class Call:
    """One call: ``events`` as they came, ``heard`` (the answer track, pcm16 at 24 kHz, per response)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.audio: list[np.ndarray] = []  # every frame of the answer track, 24 kHz
        self.marks: dict[str, int] = {}  # "started:<response>" -> index into audio when the event came
        self.location = ""
        self.channel.on("message", self._event)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._record(track)))

    def _event(self, message: str) -> None:
        event = json.loads(message)
        self.events.append(event)
        if event["type"].startswith("output_audio_buffer."):
            self.marks[f"{event['type'].split('.')[-1]}:{event.get('response_id')}"] = len(self.audio)
        self.arrived.set()

    async def _record(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM16_RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            for out in resampler.resample(frame):
                self.audio.append(out.to_ndarray().reshape(-1))

    async def dial(self, url: str, key: str | None, query: str = "?model=voice-assistant") -> httpx.Response:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Content-Type": "application/sdp"} | ({"Authorization": f"Bearer {key}"} if key else {})
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(url + "/v1/realtime/calls" + query, content=self.pc.localDescription.sdp,
                                       headers=headers)
        if answer.status_code == 201:
            self.location = answer.headers["location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        return answer

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def opened(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.channel.readyState != "open":
            if time.monotonic() > deadline:
                raise AssertionError(f"the data channel did not open in {timeout} s ({self.pc.connectionState})")
            await asyncio.sleep(0.02)

    async def next_of(self, kind: str, timeout: float = 120, after: int = 0) -> dict[str, Any]:
        """The first event of type ``kind`` at index ``after`` or later."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((e for e in self.events[after:] if e["type"] == kind), None)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} in {timeout} s; got {[e['type'] for e in self.events][-30:]}")
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    def heard(self, response_id: str) -> np.ndarray:
        """The answer track between ``started`` and ``stopped`` (or ``cleared``) of ``response_id``, as floats."""
        start = self.marks[f"started:{response_id}"]
        end = self.marks.get(f"stopped:{response_id}", self.marks.get(f"cleared:{response_id}", len(self.audio)))
        # the frames played at started..stopped reach the recorder a little later: take a margin
        return np.concatenate(self.audio[start : end + 25]).astype(np.float32) / 32768.0

    async def close(self) -> None:
        await self.pc.close()
