"""``/v1/realtime`` in full-duplex mode: one session-long request, the user's audio in and the
model's audio and words out, continuously, with no turns (Moshi).

A topology whose entry takes the caller's audio as one stream for the whole session
(:attr:`~omnictl.serving.common.capabilities.Capabilities.full_duplex`) is served this way
instead of by the turn-taking session: there is no voice activity detection, no commit, no
``response.create``. The model listens while it speaks, a frame every 80 ms.

The protocol, in OpenAI's Realtime event names where they fit:

- ``session.created`` on connect. Its session says ``"mode": "full_duplex"`` (not an OpenAI
  field), audio ``audio/pcm`` at 24 kHz both ways, ``turn_detection`` null.
- ``input_audio_buffer.append`` (base64 PCM16, 24 kHz mono): the first one opens the session's
  one response (``response.created``, ``response.output_item.added``,
  ``response.content_part.added``); each is streamed into the model as it comes.
- The response streams ``response.output_audio.delta`` (80 ms of PCM16 per frame the model
  makes) and ``response.output_audio_transcript.delta`` (the model's words, as they become
  whole) for as long as audio comes in.
- ``input_audio_buffer.commit`` ends the user's input: unlike OpenAI's (which commits a turn
  and waits for ``response.create``), here it means "my audio is over"; the model finishes the
  frames of the audio it has, then ``response.output_audio.done``,
  ``response.output_audio_transcript.done``, ``response.content_part.done``,
  ``response.output_item.done`` and ``response.done`` (status ``completed``). A later append
  opens a new response.
- ``response.cancel`` ends the response at once (``response.done``, status ``cancelled``);
  closing the socket does the same, and the request is aborted everywhere: nothing is left.
- Over WebRTC (``POST /v1/realtime/calls``) the same session runs on the call's data
  channel; the microphone track is its input and Moshi's audio goes out on the call's audio
  track (``output_audio_buffer.started`` / ``stopped``), not as delta events. A microphone
  never stops: after ``input_audio_buffer.commit`` its audio is dropped until ``response.done``,
  and then opens the next response.
- ``session.update`` is answered with ``session.updated`` when it asks for nothing a duplex
  session cannot do; a turn detector, another audio format, instructions or text output are
  refused by name. ``input_audio_buffer.clear``, ``conversation.item.*``, ``response.create``
  and ``output_audio_buffer.clear`` have no meaning without turns: each is answered with an
  ``error`` (code ``unsupported_in_full_duplex``) and the session goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from typing import Any, Callable

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnictl.audio.pcm import float_to_pcm16_bytes, pcm16_base64, pcm16_to_float
from omnictl.exceptions import OmnictlError, RealtimeEventError
from omnictl.outputs import AudioChunk, TextDelta
from omnictl.request import RequestEventKind
from omnictl.serving.common.echo import clip
from omnictl.serving.realtime.channel import Slot

log = logging.getLogger("omnictl.serving.realtime")

RATE = 24_000  # Mimi's rate; OpenAI's pcm16 rate too
FORMAT = {"type": "audio/pcm", "rate": RATE}
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013
CLOSE_NOT_READING = 1008
UNSUPPORTED = {
    "input_audio_buffer.clear": "there is no buffer: each append goes into the model at once",
    "conversation.item.create": "a full-duplex session has no conversation items: speak instead",
    "conversation.item.delete": "a full-duplex session has no conversation items",
    "conversation.item.retrieve": "a full-duplex session has no conversation items",
    "conversation.item.truncate": "a full-duplex session has no conversation items",
    "response.create": "the response starts with your first input_audio_buffer.append and lasts the session",
    "output_audio_buffer.clear": "the model's audio is sent as it is made; there is no buffer to clear",
}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def error_event(message: str, code: str, param: str | None = None, event_id: str | None = None) -> dict[str, Any]:
    """An ``error`` event in the shape the turn-taking session sends."""
    detail = {"type": "invalid_request_error", "code": code, "message": clip(message, 400), "param": param}
    return {"type": "error", "event_id": _id("event"), "error": {**detail, "event_id": event_id}}


class _Response:
    """The session's one response: its request and the ids its events carry."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.id = _id("resp")
        self.item_id = _id("item")
        self.transcript: list[str] = []
        self.input_ended = False
        self.pump: asyncio.Task[None] | None = None
        self.cancel_reason = "client_cancelled"  # what its response.done says if it is cancelled
        self.ended = False  # its response.done was sent

    def part(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def item(self, status: str) -> dict[str, Any]:
        content = [{"type": "output_audio", "transcript": "".join(self.transcript)}] if status != "in_progress" else []
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def response(self, status: str, reason: str | None = None) -> dict[str, Any]:
        out = [self.item("completed" if status == "completed" else "incomplete")] if status != "in_progress" else []
        details = {"type": status, "reason": reason} if reason else None
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": status,
            "status_details": details,
            "output": out,
            "output_modalities": ["audio"],
            # The pipeline request behind the response: `omnictl trace ID` shows its stages.
            "metadata": {"request_id": self.request.id},
        }


class DuplexSession:
    """One full-duplex session over ``pipe``: client events in (:meth:`handle`), server events out (``send``).

    Over WebRTC (``audio_out``: the call's outbound track) the model's audio goes out on the
    track, paced in real time, and the microphone comes in through :meth:`feed`, as the
    turn-taking session's do: no ``response.output_audio.delta`` events. The methods a call
    uses of a session are here (``feed``, ``handle`` of a decoded event, ``playout_finished``,
    ``close``)."""

    def __init__(
        self,
        pipe: Any,
        send: Callable[[Any], None],
        model: str,
        *,
        transport: str = "websocket",
        audio_out: Any | None = None,
    ) -> None:
        self.pipe = pipe
        self.send = send
        self.model = model
        self.transport = transport
        self.audio_out = audio_out
        self.id = _id("sess")
        self.current: _Response | None = None

    def session_object(self) -> dict[str, Any]:
        audio = {"input": {"format": FORMAT, "turn_detection": None}, "output": {"format": FORMAT}}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": self.model,
            "mode": "full_duplex",
            "output_modalities": ["audio"],
            "audio": audio,
        }

    def event(self, kind: str, **fields: Any) -> None:
        self.send({"type": kind, "event_id": _id("event"), **fields})

    async def handle(self, raw: Any) -> None:
        """One client message (its JSON text, or the event decoded by the WebRTC transport);
        a bad one is answered with an ``error`` event."""
        if not isinstance(raw, (str, bytes, bytearray)):
            raw = msgspec.json.encode(raw)  # a decoded client event: read as its text would be
        event_id = None
        try:
            try:
                event = json.loads(raw)
            except ValueError as exc:
                raise RealtimeEventError(f"the message is not JSON ({exc})", "invalid_json") from None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise RealtimeEventError("an event is a JSON object with a 'type'", "invalid_event", "type")
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            await self._dispatch(event)
        except RealtimeEventError as refused:
            self.send(error_event(refused.message, refused.code, refused.param, event_id))
        except OmnictlError as exc:  # the pipeline refused the input (its field named), or is overloaded
            field = getattr(exc, "field", None)
            self.send(error_event(str(exc), "invalid_value" if field else type(exc).__name__.lower(), field, event_id))

    async def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            audio = event.get("audio")
            if not isinstance(audio, str):
                raise RealtimeEventError("'audio' must be base64 PCM16 (24 kHz, mono)", "invalid_value", "audio")
            await self._append(pcm16_base64(audio, "audio"))
        elif kind == "input_audio_buffer.commit":
            await self._end_input()
        elif kind == "response.cancel":
            await self.cancel("client_cancelled")
        elif kind == "session.update":
            self._update(event.get("session"))
        elif kind in UNSUPPORTED:
            raise RealtimeEventError(
                f"{kind}: not in a full-duplex session ({UNSUPPORTED[kind]})", "unsupported_in_full_duplex"
            )
        else:
            raise RealtimeEventError(f"unknown event type {clip(kind, 64)!r}", "invalid_event", "type")

    def _update(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise RealtimeEventError("'session' must be an object", "invalid_value", "session")
        audio = session.get("audio") or {}
        wanted = {
            "audio.input.turn_detection": (audio.get("input") or {}).get("turn_detection"),
            "instructions": session.get("instructions"),
        }
        for param, value in wanted.items():
            if value:
                raise RealtimeEventError(
                    f"'session.{param}': a full-duplex session takes none (no turns, no prompt)",
                    "unsupported_in_full_duplex",
                    f"session.{param}",
                )
        for side in ("input", "output"):
            fmt = (audio.get(side) or {}).get("format")
            if fmt is not None and (
                not isinstance(fmt, dict) or fmt.get("type") != "audio/pcm" or fmt.get("rate", RATE) != RATE
            ):
                raise RealtimeEventError(
                    f"'session.audio.{side}.format': only audio/pcm at {RATE} Hz",
                    "invalid_value",
                    f"session.audio.{side}.format",
                )
        modalities = session.get("output_modalities")
        if modalities is not None and modalities != ["audio"]:
            raise RealtimeEventError(
                "'session.output_modalities': a full-duplex model speaks: only ['audio'] (its words come as the audio's transcript)",
                "invalid_value",
                "session.output_modalities",
            )
        self.event("session.updated", session=self.session_object())

    async def feed(self, pcm: bytes) -> None:
        """A piece of a WebRTC call's microphone (PCM16 at 24 kHz). A microphone never stops: after
        ``input_audio_buffer.commit`` its pieces are dropped until the response is done."""
        if self.current is not None and self.current.input_ended:
            return
        await self._append(pcm16_to_float(pcm))

    def playout_finished(self, response_id: str) -> None:
        """The call's track played a response to its end: nothing to do (a duplex response is no turn)."""

    async def close(self) -> None:
        """The transport is gone: the response's request is aborted everywhere."""
        await self.cancel("client_gone")

    async def _append(self, samples: Any) -> None:
        response = self.current
        if response is None or response.input_ended:
            if response is not None:
                raise RealtimeEventError(
                    "the input was ended (input_audio_buffer.commit): wait for response.done", "input_ended"
                )
            response = await self._open()
        await response.request.send(AudioChunk(samples=samples, sample_rate=RATE))

    async def _open(self) -> _Response:
        request = await self.pipe.submit({"sampling": {}}, input_stream=True)
        response = self.current = _Response(request)
        self.event("response.created", response=response.response("in_progress"))
        self.event(
            "response.output_item.added", response_id=response.id, output_index=0, item=response.item("in_progress")
        )
        self.event("response.content_part.added", **response.part(), part={"type": "output_audio", "transcript": ""})
        response.pump = asyncio.create_task(self._pump(response), name=f"duplex {self.id}")
        return response

    async def _end_input(self) -> None:
        response = self.current
        if response is None:
            raise RealtimeEventError(
                "there is no input to end: send input_audio_buffer.append first", "input_audio_buffer_empty"
            )
        if not response.input_ended:
            response.input_ended = True
            await response.request.end_input()

    async def _pump(self, response: _Response) -> None:
        """The model's frames to the client as they come, then the response's end."""
        status, reason = "completed", None
        try:
            async for event in response.request.events():
                if event.kind is not RequestEventKind.STREAM:
                    continue
                if isinstance(event.data, AudioChunk):
                    pcm = float_to_pcm16_bytes(event.data.samples)
                    if self.audio_out is not None:  # a WebRTC call: on its track, in real time
                        self.audio_out.play(response.id, pcm)
                    else:
                        delta = base64.b64encode(pcm).decode()
                        self.event("response.output_audio.delta", **response.part(), delta=delta)
                elif isinstance(event.data, TextDelta) and event.data.text:
                    response.transcript.append(event.data.text)
                    self.event("response.output_audio_transcript.delta", **response.part(), delta=event.data.text)
            await response.request.result()
        except asyncio.CancelledError:
            status, reason = "cancelled", response.cancel_reason
        except Exception as exc:  # the request failed or was aborted: the client learns why, the session goes on
            status, reason = "failed", type(exc).__name__
            log.warning("realtime duplex session %s: response %s ended: %s", self.id, response.id, clip(str(exc)))
            self.send(error_event(str(exc), "response_failed"))
        self._end(response, status, reason)

    def _end(self, response: _Response, status: str, reason: str | None) -> None:
        """The response's closing events, once: from its pump, or from :meth:`cancel` when the
        pump was cancelled before it ran (a cancel right after the first append)."""
        if response.ended:
            return
        response.ended = True
        transcript = "".join(response.transcript)
        if self.audio_out is not None:
            if status == "completed":
                self.audio_out.finish(response.id)  # the track plays what it holds, then says stopped
            else:
                self.audio_out.clear()  # cancelled: what the track holds is dropped
        self.event("response.output_audio.done", **response.part())
        self.event("response.output_audio_transcript.done", **response.part(), transcript=transcript)
        self.event(
            "response.content_part.done", **response.part(), part={"type": "output_audio", "transcript": transcript}
        )
        item = response.item("completed" if status == "completed" else "incomplete")
        self.event("response.output_item.done", response_id=response.id, output_index=0, item=item)
        self.event("response.done", response=response.response(status, reason))
        if self.current is response:
            self.current = None

    async def cancel(self, reason: str) -> None:
        """End the response now: its request is aborted everywhere, ``response.done`` says ``cancelled``."""
        response = self.current
        if response is None:
            return
        self.current = None
        response.cancel_reason = reason
        if response.pump is not None:  # first: its response.done says cancelled, not the abort's failure
            response.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await response.pump
        self._end(response, "cancelled", reason)  # a pump cancelled before it ran said nothing
        await self.pipe.abort(response.request.id)


async def serve_duplex(websocket: WebSocket, slot: Any, hub: Any, pipe: Any) -> None:
    """A WebSocket session in full-duplex mode (route.py picks it for a full-duplex topology);
    ``slot`` is the session's claim on ``--max-realtime-sessions`` (or the refusal), released by the caller."""
    state = hub.state
    offered = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip() == "realtime"
    ]
    await websocket.accept(subprotocol=offered[0] if offered else None)
    refused = hub.refused(websocket.query_params, pipe) if isinstance(slot, Slot) else slot
    if refused is not None:  # the session limit, or a wrong ?model= / ?intent=: said, then closed
        state.metrics.outcome("rejected")
        code = CLOSE_TRY_LATER if refused is slot else CLOSE_POLICY
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(json.dumps(error_event(refused.message, refused.code, refused.param)))
            await websocket.close(code=code, reason=clip(refused.message, 100))
        return
    outbox: asyncio.Queue[str | None] = asyncio.Queue()
    pending = [0]  # characters queued and not yet written
    limit = state.limits.max_realtime_outbox_bytes
    overflowed = asyncio.Event()

    def send(event: dict[str, Any]) -> None:
        text = json.dumps(event)
        pending[0] += len(text)
        if pending[0] > limit:
            overflowed.set()  # the client does not read: the socket is closed, not filled forever
            return
        outbox.put_nowait(text)

    async def write() -> None:
        while (text := await outbox.get()) is not None:
            pending[0] -= len(text)
            await websocket.send_text(text)

    async def receive() -> None:
        while True:
            try:
                message = await websocket.receive()
            except WebSocketDisconnect:
                return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            await session.handle(text if text is not None else message.get("bytes") or b"")

    session = DuplexSession(pipe, send, websocket.query_params.get("model") or state.model_name)
    send({"type": "session.created", "event_id": _id("event"), "session": session.session_object()})
    writer = asyncio.create_task(write())
    receiver = asyncio.create_task(receive())
    overflow = asyncio.create_task(overflowed.wait())
    try:
        await asyncio.wait({receiver, writer, overflow}, return_when=asyncio.FIRST_COMPLETED)
        if overflowed.is_set():
            log.warning("realtime duplex session %s: the client is not reading its events; closing it", session.id)
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await websocket.close(code=CLOSE_NOT_READING, reason="the client is not reading its events")
    finally:
        receiver.cancel()
        overflow.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError):
            await receiver
        await session.cancel("client_gone")  # the socket is gone: the request is aborted, nothing left
        outbox.put_nowait(None)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError):
            await writer
