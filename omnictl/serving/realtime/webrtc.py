"""``POST /v1/realtime/calls``: the Realtime protocol over WebRTC (aiortc), as OpenAI serves it.

The client posts its SDP offer (``Content-Type: application/sdp``, or OpenAI's multipart form
with an ``sdp`` field and an optional ``session`` JSON field, applied as a ``session.update``
before ``session.created``); the answer comes back with 201 and ``Location:
/v1/realtime/calls/{call_id}``. The API key and ``?model=`` / ``?intent=`` are checked as for
the WebSocket (401, 404 / 400 naming the field); a body that is not an offer is a 400 saying
what is wrong with it.

The call drives the same :class:`~omnictl.serving.realtime.session.RealtimeSession` as a
WebSocket does, through the same :class:`~omnictl.serving.realtime.channel.RealtimeHub`:

* client and server events travel on the data channel the client opens, ``oai-events``;
* the microphone track, decoded and resampled (48 kHz Opus to the session's 24 kHz pcm16),
  is fed to the session in 100 ms pieces, as appends would be: server VAD, turns,
  barge-in, truncation all work unchanged;
* the answer's audio goes out on the server's own audio track, paced in real time in
  20 ms frames (:class:`AnswerTrack`), never as ``response.output_audio.delta`` events;
  the track says ``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` (on barge-in
  or cancel it drops what it holds at once);
* the echo guard is off (``session.audio.input.echo_guard: false``, ``transport: "webrtc"``):
  a browser's WebRTC stack cancels echo itself. A session field turns it back on.

ICE: no STUN or TURN server is used (the server answers with its host candidates). Which
local addresses it offers: ``OMNICTL_WEBRTC_HOSTS`` (comma-separated addresses) when set;
else the one the offer came in on, which the client reached (for the default loopback
``--host``, 127.0.0.1: the call's traffic stays on it).

A call ends when its data channel closes, its connection fails or closes, it does not
connect within ``--call-connect-timeout`` (10 s, counted from its offer's arrival), nothing
arrives on it for ``IDLE_TIMEOUT_S`` (5 min), the client stops reading its events,
``POST /v1/realtime/calls/{id}/hangup``, or the server stops. Calls count against
``--max-realtime-sessions`` with the WebSockets from the moment the offer arrives (the slot
is claimed before anything is awaited, and given back however the call ends); calls not yet
connected count against ``--max-connecting-calls`` (4) too, so offers that never connect
cannot hold every slot. ``/health`` shows them (``realtime.peer_connections``).

The data channel is bounded as the WebSocket is: a message over
``Limits.max_realtime_message_bytes`` is answered with an ``error`` event naming the limit
(it is never queued whole); at most ``CHANNEL_EVENTS_PER_S`` events a second (after a burst
of ``CHANNEL_BURST``) and ``INBOX_BYTES`` waiting for the session are taken; an event past
either is dropped and answered with an ``error`` event (``rate_limit_exceeded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InvalidAccessError, OperationError
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnictl.audio import FrameResampler, float_to_pcm16_bytes
from omnictl.inputs import PCM16_RATE
from omnictl.serving.common.capabilities import capabilities
from omnictl.serving.common.echo import clip
from omnictl.serving.common.errors import error_response
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.answer_track import AnswerTrack
from omnictl.serving.realtime.channel import Outbox, RealtimeHub, Slot, message_size
from omnictl.serving.realtime.duplex import DuplexSession
from omnictl.serving.realtime.ice import install_host_filter, restrict_to
from omnictl.serving.realtime.rate import TokenBucket
from omnictl.serving.realtime.session import RealtimeSession

log = logging.getLogger("omnictl.serving.realtime")

CHANNEL = "oai-events"  # the data channel OpenAI's clients open for events
FEED_BYTES = PCM16_RATE * 100 // 1000 * 2  # the microphone reaches the session in 100 ms pieces
# A call on which nothing arrives this long (no audio, no event) is closed: a page left open
# with its microphone off. A peer that is gone fails ICE's consent checks (about 30 s) first.
IDLE_TIMEOUT_S = 300.0
INBOX_ITEMS = 200  # microphone pieces and events waiting for the session (20 s of audio)
# What waits for the session, in bytes: 200 pieces of audio are under 1 MB; events are bounded
# one by one (``max_realtime_message_bytes``) but a flood of big ones is bounded here.
INBOX_BYTES = 4 * 1024 * 1024
# Events a client may send on the data channel: a WebSocket's client is held back by TCP while
# its session works, a data channel's is not (aiortc hands over each message as it arrives).
CHANNEL_EVENTS_PER_S = 100.0
CHANNEL_BURST = 200.0
MAX_OFFER_BYTES = 64 * 1024  # an SDP offer is a few kilobytes


# --- one call --------------------------------------------------------------------------------


@dataclass
class Call:
    id: str
    pc: RTCPeerConnection
    outbox: Outbox
    track: AnswerTrack
    slot: Slot  # its place under --max-realtime-sessions (and, until connected, --max-connecting-calls)
    message_limit: int  # Limits.max_realtime_message_bytes: a bigger data channel message is refused
    session: RealtimeSession | None = None
    channel: Any = None  # aiortc's RTCDataChannel, once the client opened it
    inbox: asyncio.Queue[tuple[str, str | bytes | int]] = field(default_factory=lambda: asyncio.Queue(INBOX_ITEMS))
    inbox_bytes: int = 0  # what the inbox holds, in bytes (INBOX_BYTES at most)
    events: TokenBucket = field(default_factory=lambda: TokenBucket(CHANNEL_EVENTS_PER_S, CHANNEL_BURST))
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    last_heard: float = field(default_factory=time.monotonic)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    dropped: int = 0  # inbox items dropped because the session fell behind

    def end(self, why: str) -> None:
        if not self.ended.is_set():
            self.why = why
            self.ended.set()

    def message(self, message: str | bytes) -> None:
        """A data channel message: too big, too many, or queued for the session in arrival order."""
        self.last_heard = time.monotonic()
        size = message_size(message)
        if size > self.message_limit:  # only its size is queued: the session answers with an error event
            return self.arrive("oversize", size, 0)
        if not self.events.take(1):
            return self._drop("event", f"more than {CHANNEL_EVENTS_PER_S:g} events a second")
        self.arrive("event", message, size)

    def arrive(self, kind: str, data: str | bytes | int, size: int) -> None:
        self.last_heard = time.monotonic()
        if self.inbox_bytes and self.inbox_bytes + size > INBOX_BYTES:
            return self._drop(kind, f"{self.inbox_bytes} bytes waiting")
        try:
            self.inbox.put_nowait((kind, data))
        except asyncio.QueueFull:
            return self._drop(kind, f"{INBOX_ITEMS} items waiting")
        self.inbox_bytes += size

    def taken(self, data: str | bytes | int) -> None:
        """The session took ``data`` from the inbox."""
        if not isinstance(data, int):
            self.inbox_bytes -= message_size(data)

    def _drop(self, kind: str, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 100 == 0:  # once, then every hundredth
            log.warning(
                "realtime call %s: the session is behind (%s); dropped %d item(s) so far (the last: %s)",
                self.id,
                why,
                self.dropped,
                kind,
            )
        if kind != "audio" and self.session is not None:  # a client waiting for its event's answer hears why
            self.session.send(
                ev.error_event(
                    ev.EventError(
                        f"this event was dropped: the data channel takes at most {CHANNEL_EVENTS_PER_S:g} events a "
                        f"second after a burst of {CHANNEL_BURST:g}, and the session is behind ({why}); send fewer",
                        "rate_limit_exceeded",
                        kind="rate_limit_error",
                    )
                )
            )

    def spawn(self, work: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work, name=f"{name} {self.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Calls:
    """The WebRTC calls of one server: answered, run, ended, counted."""

    def __init__(self, hub: RealtimeHub) -> None:
        self.hub = hub
        self.open: dict[str, Call] = {}
        install_host_filter()

    def stats(self) -> dict[str, int]:
        return {
            "sessions": self.hub.open,
            "websocket_sessions": self.hub.by_transport["websocket"],
            "webrtc_sessions": self.hub.by_transport["webrtc"],
            "peer_connections": len(self.open),
        }

    async def close_all(self) -> None:
        """The server stops: every call ends now."""
        for call in list(self.open.values()):
            call.end("the server is stopping")
        for call in list(self.open.values()):
            for task in list(call.tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # --- POST /v1/realtime/calls ----------------------------------------------------------

    async def create(self, request: Request) -> Response:
        state = self.hub.state
        pipe = state.pipeline
        if pipe is None:
            return error_response(503, "the pipeline is still starting; retry shortly", "server_error", "starting")
        serves = capabilities(pipe.topology)
        if not (serves.conversation or serves.full_duplex):  # a call is a conversation: something must answer it
            return error_response(
                400,
                f"topology {pipe.topology.name!r} has no text or audio terminal: nothing answers a call (a "
                "recognizer alone serves transcription sessions over the WebSocket, /v1/realtime?intent=transcription)",
                "invalid_request_error",
                "unsupported_topology",
            )
        # The slot is claimed before the first await (reading the offer): offers that arrive
        # together must not all pass one check and then open past the limit.
        slot = self.hub.claim("webrtc")
        if isinstance(slot, ev.EventError):
            state.metrics.outcome("rejected")
            return error_response(429, slot.message, "rate_limit_error", slot.code)
        try:
            return await self._admitted(request, slot)
        finally:
            if slot.call is None:  # refused or failed before its call took the slot: it is given back here
                slot.release()

    async def _admitted(self, request: Request, slot: Slot) -> Response:
        state = self.hub.state
        pipe = state.pipeline
        assert pipe is not None
        timeout = state.limits.realtime_connect_timeout_s
        try:
            offer = await asyncio.wait_for(_read_offer(request), timeout)
        except asyncio.TimeoutError:
            state.metrics.outcome("rejected")
            return error_response(
                408,
                f"the offer did not arrive within {timeout:g} s (--call-connect-timeout)",
                "invalid_request_error",
                "timeout",
            )
        if isinstance(offer, Response):
            state.metrics.outcome("rejected")
            return offer
        sdp, session_config = offer
        query = dict(request.query_params)
        if isinstance(session_config, dict) and isinstance(session_config.get("model"), str):
            query.setdefault("model", session_config["model"])
        refused = self.hub.refused(query, pipe)
        if refused is not None:
            state.metrics.outcome("rejected")
            status = 404 if refused.code == "model_not_found" else 400
            return error_response(status, refused.message, "invalid_request_error", refused.code, refused.param)
        server = request.scope.get("server")  # the local address this offer came in on
        restrict_to(server[0] if server else None)
        return await self._answer(request, sdp, session_config, query, slot)

    async def _answer(self, request: Request, sdp: str, config: Any, query: dict[str, str], slot: Slot) -> Response:
        state = self.hub.state
        pipe = state.pipeline
        assert pipe is not None
        outbox = Outbox(state.limits.max_realtime_outbox_bytes)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN/TURN: host candidates only
        track = AnswerTrack(outbox.put)
        call = Call(ev.new_id("rtc"), pc, outbox, track, slot, state.limits.max_realtime_message_bytes)
        self.open[call.id] = call
        slot.call = call.id  # from here on, _end gives it back
        self._wire(call)  # before the offer is read: reading it raises the "track" event
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except (ValueError, TypeError, KeyError, IndexError, AssertionError, InvalidAccessError, OperationError) as exc:
            # aiortc's SDP parser (which asserts on some malformed lines: "v=0\r\nm=audio\r\n" once
            # answered 500 and left its peer connection open), or an offer it cannot answer
            await self._end(call)
            state.metrics.outcome("rejected")
            return _bad_offer(f"the SDP offer could not be read: {clip(str(exc) or type(exc).__name__, 200)}")
        except BaseException:  # whatever else: no peer connection is left open behind the error
            await self._end(call)
            raise
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            await self._end(call)
            state.metrics.outcome("rejected")
            return _bad_offer("the SDP offer has no audio media section (m=audio): the call needs one for speech")
        pc.addTrack(track)
        session: Any  # a full-duplex session has the methods a call uses of a turn-taking one
        if capabilities(pipe.topology).full_duplex:
            model = query.get("model") or state.model_name
            session = DuplexSession(pipe, outbox.put, model, transport="webrtc", audio_out=track)
        else:
            session = self.hub.session(pipe, outbox.put, query, request.headers, "webrtc", audio_out=track)
        track.on_stopped = session.playout_finished  # a reply lives until it has been heard
        call.session = session
        try:
            if config is not None:
                refused = await _apply(session, config)
                if refused is not None:
                    state.metrics.outcome("rejected")
                    await self._end(call)
                    return error_response(400, refused.message, "invalid_request_error", refused.code, refused.param)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except BaseException:
            await self._end(call)
            raise
        call.spawn(self._run(call), "webrtc call")
        session.send(ev.SessionCreated(session=session.session_object()))
        log.info("realtime call %s: session %s answered", call.id, session.id)
        return Response(
            pc.localDescription.sdp,
            status_code=201,
            media_type="application/sdp",
            headers={"Location": f"/v1/realtime/calls/{call.id}"},
        )

    async def hangup(self, request: Request) -> Response:
        call = self.open.get(request.path_params["call_id"])
        if call is None:
            return error_response(
                404,
                f"no call {clip(request.path_params['call_id'], 64)!r} is open",
                "invalid_request_error",
                "not_found",
            )
        call.end("hung up by the client")
        return JSONResponse({"id": call.id, "status": "hung up"})

    # --- the call's life ------------------------------------------------------------------

    def _wire(self, call: Call) -> None:
        pc = call.pc

        @pc.on("datachannel")
        def on_channel(channel: Any) -> None:
            if channel.label != CHANNEL or call.channel is not None:
                log.info("realtime call %s: data channel %r ignored (events go on %r)", call.id, channel.label, CHANNEL)
                return
            call.channel = channel
            channel.on("message", call.message)
            channel.on("close", lambda: call.end("the data channel closed"))

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                call.spawn(self._listen(call, track), "webrtc microphone")

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState == "connected":
                call.slot.connected()
                call.connected.set()
            elif pc.connectionState in ("failed", "closed"):
                call.end(f"the peer connection {pc.connectionState}")

    async def _listen(self, call: Call, track: MediaStreamTrack) -> None:
        """The microphone: decoded frames, resampled to the session's 24 kHz mono pcm16, in 100 ms pieces."""
        resampler = FrameResampler(PCM16_RATE)
        pending = bytearray()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):  # an audio track yields audio frames
                continue
            pending += float_to_pcm16_bytes(resampler.push(frame))
            if len(pending) >= FEED_BYTES:
                call.arrive("audio", bytes(pending), len(pending))
                pending.clear()

    async def _consume(self, call: Call) -> None:
        """Events and microphone audio, one at a time in arrival order, as the WebSocket's receive loop."""
        session = call.session
        assert session is not None
        while True:
            kind, data = await call.inbox.get()
            call.taken(data)
            if kind == "audio":
                assert isinstance(data, bytes)
                await self.hub.guarded(session, functools.partial(session.feed, data), "piece of microphone audio")
            elif kind == "oversize":
                assert isinstance(data, int)
                await self.hub.guarded(session, functools.partial(self.hub.too_large, data), "event")
            else:
                assert not isinstance(data, int)
                await self.hub.deliver(session, data)

    async def _write(self, call: Call) -> None:
        while call.channel is None or call.channel.readyState != "open":
            if call.channel is not None and call.channel.readyState == "closed":
                return
            await asyncio.sleep(0.02)
        while (message := await call.outbox.get()) is not None:
            while call.channel.bufferedAmount > call.outbox.limit:  # SCTP has not sent what it holds
                await asyncio.sleep(0.01)
            if call.channel.readyState != "open":
                return
            call.channel.send(message)

    async def _watch(self, call: Call) -> None:
        """End the call when it does not connect in time (counted from its offer's arrival) or goes idle."""
        timeout = self.hub.state.limits.realtime_connect_timeout_s
        try:
            await asyncio.wait_for(call.connected.wait(), max(0.0, call.slot.claimed_at + timeout - time.monotonic()))
        except asyncio.TimeoutError:
            return call.end(f"it did not connect within {timeout:g} s (--call-connect-timeout)")
        while True:
            idle = time.monotonic() - call.last_heard
            if idle >= IDLE_TIMEOUT_S:
                return call.end(f"nothing arrived on it for {IDLE_TIMEOUT_S:g} s")
            await asyncio.sleep(min(5.0, IDLE_TIMEOUT_S - idle))

    async def _run(self, call: Call) -> None:
        call.spawn(self._consume(call), "webrtc events")
        call.spawn(self._write(call), "webrtc writer")
        call.spawn(self._watch(call), "webrtc watch")
        overflow = asyncio.ensure_future(call.outbox.overflowed.wait())
        ended = asyncio.ensure_future(call.ended.wait())
        try:
            await asyncio.wait({overflow, ended}, return_when=asyncio.FIRST_COMPLETED)
            if call.outbox.overflowed.is_set():
                call.end(f"the client is not reading its events ({call.outbox.pending} characters waiting)")
        finally:
            overflow.cancel()
            ended.cancel()
            await self._end(call)

    async def _end(self, call: Call) -> None:
        """Close everything of ``call``, once: its session (aborting its pipeline requests), tasks, peer connection."""
        if self.open.pop(call.id, None) is None:
            return
        log.info("realtime call %s ended: %s", call.id, call.why or "refused")
        current = asyncio.current_task()
        call.slot.release()
        if call.session is not None:
            await call.session.close()
        call.outbox.close()
        for task in list(call.tasks):
            if task is not current:
                task.cancel()
        for task in list(call.tasks):
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        call.track.stop()
        await call.pc.close()


async def _bounded_body(request: Request) -> bytes | None:
    """The body, read as it arrives; None once it passes ``MAX_OFFER_BYTES`` (a body sent
    without a length is not held whole before it is measured)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_OFFER_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _bad_offer(message: str, param: str = "sdp") -> JSONResponse:
    return error_response(400, message, "invalid_request_error", "invalid_offer", param)


async def _read_offer(request: Request) -> tuple[str, Any] | Response:
    """The SDP offer and the ``session`` configuration (None if not sent), or the 400 saying what is wrong."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_OFFER_BYTES:
        return _bad_offer(f"the body is {declared} bytes; an SDP offer is at most {MAX_OFFER_BYTES} bytes")
    config: Any = None
    if kind == "application/sdp":
        body = await _bounded_body(request)
        if body is None:
            return _bad_offer(
                f"the body is over {MAX_OFFER_BYTES} bytes; an SDP offer is at most {MAX_OFFER_BYTES} bytes"
            )
        try:
            sdp = body.decode("utf-8")
        except UnicodeDecodeError:
            return _bad_offer("the SDP offer is not UTF-8 text")
    elif kind == "multipart/form-data":
        async with request.form(max_files=2, max_fields=4, max_part_size=MAX_OFFER_BYTES) as form:
            raw = form.get("sdp")
            if raw is None:
                return _bad_offer("the form has no 'sdp' field (the SDP offer)")
            if isinstance(raw, UploadFile):
                # max_part_size bounds a form's plain fields only: a file part is measured here
                if raw.size is not None and raw.size > MAX_OFFER_BYTES:
                    return _bad_offer(
                        f"the form's 'sdp' file is {raw.size} bytes; an SDP offer is at most {MAX_OFFER_BYTES} bytes"
                    )
                raw = (await raw.read()).decode("utf-8", "replace")
            sdp = raw
            session = form.get("session")
            if isinstance(session, UploadFile):
                session = (await session.read()).decode("utf-8", "replace")
            if session is not None:
                try:
                    config = json.loads(session)
                except json.JSONDecodeError as exc:
                    return _bad_offer(f"the form's 'session' field is not JSON ({exc})", "session")
                if not isinstance(config, dict):
                    return _bad_offer("the form's 'session' field must be a JSON object", "session")
    else:
        return error_response(
            415,
            f"Content-Type {clip(kind or '(none)', 64)!r}: send the SDP offer as 'application/sdp', or as the "
            "'sdp' field of a 'multipart/form-data' form (with an optional 'session' JSON field)",
            "invalid_request_error",
            "unsupported_media_type",
        )
    sdp = sdp.strip().replace("\r\n", "\n").replace("\n", "\r\n") + "\r\n"
    if not sdp.startswith("v=0"):
        return _bad_offer("the body is not an SDP offer: it must begin with 'v=0'")
    if "\r\nm=" not in sdp:
        return _bad_offer("the SDP offer has no media section (m=audio for speech, m=application for events)")
    return sdp, config


async def _apply(session: RealtimeSession, config: dict[str, Any]) -> ev.EventError | None:
    """The form's ``session`` configuration, applied as a ``session.update`` before ``session.created``."""
    config = {k: v for k, v in config.items() if k != "model"}  # checked as ``?model=``
    send = session.send
    session.send = lambda _event: None  # session.created says it all
    try:
        await session.handle(ev.decode_client_event(json.dumps({"type": "session.update", "session": config})))
    except ev.EventError as error:
        param = error.param or ""
        error.message = f"the form's 'session' field: {error.message}"
        error.param = "session" + ("." + param.removeprefix("session.") if param else "")
        return error
    finally:
        session.send = send
    return None
