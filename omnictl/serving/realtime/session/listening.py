"""The session's input audio: appends (bounded in size and rate), the input buffer, turn
detection (server VAD or the semantic turn model, behind the session's audio front end) and
the echo guard's hold.

:class:`Listener` hears; it decides nothing about turns. What its detector finds goes to the
turn-taking core (:mod:`omnictl.serving.realtime.turn_taking`) through the shell, which tells
it back what to commit or clear. Speech heard while the answer plays is held here until the
echo guard judges whether it is the answer's own voice coming back (then dropped: no turn, not
in the buffer) or the user's (then it starts, late by the guard's window)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from typing import Callable

import numpy as np

from omnictl.audio import pcm16_to_float
from omnictl.inputs import PCM16_RATE
from omnictl.serving.realtime import events as ev
from omnictl.serving.realtime.echo_guard import ECHO_SHARE, WINDOW_MS, EchoGuard
from omnictl.serving.realtime.formats import PCM
from omnictl.serving.realtime.frontend import AudioFrontEnd, SpeechFrontEnd
from omnictl.serving.realtime.rate import TokenBucket
from omnictl.serving.realtime.session.context import SessionContext
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector, shared_model
from omnictl.serving.realtime.vad import SileroModel, TurnDetector, TurnEvent, VadSettings, vad_executor

log = logging.getLogger("omnictl.serving.realtime")

MIN_COMMIT_MS = 100  # a commit of less audio than this is refused, as OpenAI refuses it
PREFIX_MS = 300  # audio kept before speech starts, where the turn detection has no setting for it


class Listener:
    def __init__(self, ctx: SessionContext, echo: EchoGuard, silero: Callable[[], SileroModel]) -> None:
        self.ctx = ctx
        self.echo = echo
        self.silero = silero  # the VAD model, loaded when first needed
        limits = ctx.state.limits
        self.rate = TokenBucket(limits.realtime_audio_speed, limits.realtime_audio_burst_s)  # seconds of audio
        self.buffer = bytearray()  # pcm16 24 kHz, since the last commit or clear
        self.audio_ms = 0.0  # audio appended over the whole session
        self.frontend = AudioFrontEnd()  # decoding and turn detection, state kept across appends
        self.turns: TurnDetector | SemanticTurnDetector | None = None
        self.held_start: tuple[int, float] | None = None  # speech held for the echo guard: (start ms, at audio ms)

    def reset(self) -> None:
        """Turn detection as the settings say, from a clean state."""
        vad = self.ctx.settings.vad
        self.turns = None
        self.held_start = None
        if isinstance(vad, ev.ServerVad):
            self.turns = TurnDetector(VadSettings(vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms))
        elif isinstance(vad, ev.SemanticVad):
            self.turns = SemanticTurnDetector(shared_model(), vad.eagerness)
        # a new 16 kHz stream and VAD state for the new turn detection (or none)
        self.frontend.listen(None if self.turns is None else SpeechFrontEnd(self.silero(), self.turns))

    @property
    def buffered_ms(self) -> float:
        return len(self.buffer) / 2 / PCM16_RATE * 1000

    def _too_large(self, refuse: ev.Refusal) -> ev.EventError:
        limit = self.ctx.state.limits.max_realtime_buffer_bytes
        return refuse(
            f"the input audio buffer is limited to {limit} bytes ({limit / 2 / PCM16_RATE:.0f} s of audio); "
            "commit or clear it",
            "input_audio_buffer_too_large",
            "audio",
        )

    def decode(self, event: ev.InputAudioBufferAppend) -> bytes:
        """An append's audio as pcm16 at 24 kHz, checked (size, rate, base64, whole samples)."""
        ctx = self.ctx
        codec, refuse = ctx.settings.input_codec, ev.Refusal(event.event_id)
        sent = len(event.audio) * 3 // 4 - event.audio[-2:].count("=")  # bytes, before decoding
        size = sent * PCM.bytes_per_second // codec.bytes_per_second  # what the buffer will hold of it
        if len(self.buffer) + size > ctx.state.limits.max_realtime_buffer_bytes:
            raise self._too_large(refuse)
        if not self.rate.take(size / 2 / PCM16_RATE):
            limits = ctx.state.limits
            raise refuse(
                f"input_audio_buffer.append: audio arrives faster than this server takes it (at most "
                f"{limits.realtime_audio_speed:g}x real time after the first {limits.realtime_audio_burst_s:g} s); "
                "this append was dropped",
                "input_audio_rate_exceeded",
                "audio",
            )
        try:
            raw = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise refuse(
                f"input_audio_buffer.append: 'audio' is not valid base64 ({exc})", "invalid_base64", "audio"
            ) from exc
        if len(raw) % codec.sample_bytes:
            raise refuse(
                f"input_audio_buffer.append: pcm16 audio must hold whole 16-bit samples, got {len(raw)} bytes",
                "invalid_audio",
                "audio",
            )
        if not raw:  # no audio: nothing to hear, no turn to open (it was a traceback per event)
            return b""
        return self.frontend.to_pcm16(codec, raw)

    def take_in(self, raw: bytes, event_id: str | None) -> None:
        """pcm16 at 24 kHz into the buffer (refused past its bound)."""
        if len(self.buffer) + len(raw) > self.ctx.state.limits.max_realtime_buffer_bytes:
            raise self._too_large(ev.Refusal(event_id))
        self.buffer += raw
        self.audio_ms += len(raw) / 2 / PCM16_RATE * 1000

    async def detect(self, raw: bytes) -> tuple[TurnDetector | SemanticTurnDetector, list[TurnEvent]] | None:
        """What turn detection hears in ``raw`` (None: it is off, or was reset meanwhile)."""
        speech = self.frontend.speech
        if speech is None or not raw:
            return None
        # Resampling and Silero run in a worker thread: on the event loop, a flood of
        # appends once held /health for 41 s. This session waits for its own audio (and
        # so reads no more from its socket meanwhile); every other request goes on.
        heard, found = await asyncio.get_running_loop().run_in_executor(vad_executor(), speech.hear, raw)
        if speech is not self.frontend.speech:  # cleared or reconfigured meanwhile
            return None
        self.echo.heard(heard)
        return speech.turns, found

    def hold(self, start_ms: int) -> None:
        """Speech started while the answer plays: judged once enough is heard."""
        self.held_start = (start_ms, self.audio_ms)

    def judge_due(self) -> bool:
        return self.held_start is not None and self.audio_ms - self.held_start[1] >= WINDOW_MS

    async def echo_judged(self, turns: TurnDetector | SemanticTurnDetector) -> int | None:
        """Judge the held speech: None if it was the answer's own echo (then dropped: no
        barge-in, not in the buffer); else where it started (then it starts, late by the window)."""
        assert self.held_start is not None
        start_ms, at_ms = self.held_start
        self.held_start = None
        window = int(min(WINDOW_MS * 2, max(100.0, self.audio_ms - at_ms + (at_ms - start_ms))))
        share = await asyncio.get_running_loop().run_in_executor(vad_executor(), self.echo.echo_share, window)
        if share >= ECHO_SHARE:
            log.info(
                "realtime session %s: speech at %d ms is the answer's echo (%.2f of its energy): dropped",
                self.ctx.id,
                start_ms,
                share,
            )
            turns.drop_turn()
            return None
        log.info(
            "realtime session %s: speech at %d ms over the answer is not its echo (%.2f)", self.ctx.id, start_ms, share
        )
        return start_ms

    def trim(self) -> None:
        """Between turns, keep only what prefix padding may need."""
        vad = self.ctx.settings.vad
        if self.turns is None or self.turns.speaking or vad is None:
            return
        padding = vad.prefix_padding_ms if isinstance(vad, ev.ServerVad) else PREFIX_MS
        keep = int((padding + 100) * PCM16_RATE / 1000) * 2
        del self.buffer[: max(0, len(self.buffer) - keep)]

    def end_detector_turn(self) -> None:
        """The client ended the turn the detector was in: its stop would commit the silence
        after it as a second item (or, under 100 ms of it, refuse an append)."""
        if self.turns is not None:
            self.turns.drop_turn()

    def take(self, event_id: str | None) -> np.ndarray:
        """The buffer, as the audio of a turn being committed (refused under ``MIN_COMMIT_MS``)."""
        ms = self.buffered_ms
        if ms < MIN_COMMIT_MS:
            raise ev.Refusal(event_id)(
                f"input_audio_buffer.commit: the buffer holds {ms:.0f} ms of audio; at least {MIN_COMMIT_MS} ms "
                "is needed",
                "input_audio_buffer_commit_empty",
            )
        samples = pcm16_to_float(bytes(self.buffer))
        self.buffer.clear()
        self.ctx.check_memory(0, samples.nbytes, event_id)
        return samples
