"""``code2wav``: the streaming vocoder and audio terminal.

Codec frames arrive in the talker's stream chunks (``codes``); once ``chunk_frames``
new frames are in, the vocoder decodes them with ``left_context`` earlier frames in
front and the new samples go out as an audio chunk. The vocoder is causal, so with
enough left context a chunk's samples equal those of decoding everything at once.
Samples are tracked by position: a decode of frames ``[a, b)`` yields the samples
``[a * U, b * U - lost)``, where ``U`` is the samples per frame and ``lost`` the few
trailing samples the causal transposed convolutions drop; the next chunk re-creates
them, so the stream has no gaps and its total length equals a one-shot decode's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnictl.models.qwen3_omni.weights import load_code2wav
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S, PlaybackDeadlines
from omnictl.schedulers.base import (
    IncomingKind,
    IncomingMessage,
    OutgoingKind,
    OutgoingMessage,
    Scheduler,
    SchedulerLoad,
)

SAMPLE_RATE = 24_000  # Qwen3-Omni's code2wav output rate


@dataclass(slots=True)
class _Stream:
    frames: list[torch.Tensor] = field(default_factory=list)  # [n, groups] blocks
    count: int = 0  # frames received
    decoded_to: int = 0  # frames covered by emitted audio
    emitted: int = 0  # samples emitted
    pieces: list[np.ndarray] = field(default_factory=list)
    final: bool = False  # the talker's result came: vocode what is left, then the result
    transcript: str = ""
    waiting_since: int = 0  # arrival order of its oldest frames not vocoded yet (fifo's order)
    voice: str | None = None  # the request's voice (Qwen2.5-Omni's token2wav is conditioned on it)


class Vocoder:
    """Decodes a window of frames and returns the samples owed after ``emitted``."""

    def __init__(self, model_path: str | Path | None, device: str | None = None, *, left_context: int = 25) -> None:
        self.code2wav = load_code2wav(model_path, device)
        self.device = self.code2wav.device
        self.samples_per_frame = int(self.code2wav.total_upsample)
        self.left_context = left_context

    @torch.inference_mode()
    def samples(self, codes: torch.Tensor, end: int, emitted: int) -> tuple[np.ndarray, int]:
        """Samples from ``emitted`` up to what frames ``[.., end)`` determine; and the new ``emitted``."""
        first_owed_frame = emitted // self.samples_per_frame
        start = max(0, first_owed_frame - self.left_context)
        window = codes[start:end].T[None].to(self.device)  # [1, groups, frames]
        wav = self.code2wav(window).reshape(-1).float().cpu().numpy()
        offset = start * self.samples_per_frame
        new_end = offset + wav.shape[0]
        return wav[emitted - offset :].astype(np.float32), new_end


class Code2WavScheduler(Scheduler):
    def __init__(
        self,
        vocoder: Vocoder,
        *,
        chunk_frames: int = 10,
        first_chunk_frames: int | None = None,
        audio_policy: str = DEFAULT_POLICY,
        ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
    ) -> None:
        """``first_chunk_frames``: the first chunk is vocoded as soon as this many frames are
        in (default: ``chunk_frames``), so a request's first audio waits for fewer talker steps;
        the vocoder is causal, so where chunks are cut does not change the samples.
        ``audio_policy``: which stream with a chunk due is vocoded next (see
        :mod:`omnictl.playback.policy`): the oldest (``fifo``) or the one whose listener runs
        out of audio soonest (``deadline``)."""
        super().__init__()
        first = chunk_frames if first_chunk_frames is None else first_chunk_frames
        for name, value in (("chunk_frames", chunk_frames), ("first_chunk_frames", first)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.vocoder = vocoder
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = first
        self.deadlines = PlaybackDeadlines(audio_policy, ttfp_target_s)
        self._streams: dict[str, _Stream] = {}
        self._arrivals = itertools.count()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="code2wav")

    async def stop(self) -> None:
        await super().stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        while True:
            if not self._due():
                self._take(await self.inbox.get())
            while not self.inbox.empty():  # everything that came meanwhile, before choosing
                self._take(self.inbox.get_nowait())
            due = self._due()
            if due:
                rid = self.deadlines.pick(due, time.monotonic())
                await self._vocode(rid, self._streams[rid])
            self._finish_done()

    def _take(self, message: IncomingMessage) -> None:
        rid = message.request_id
        if message.kind is IncomingKind.STREAM_DONE:
            return
        stream = self._streams.get(rid)
        if stream is None:
            stream = self._streams[rid] = _Stream(voice=message.params.get("voice"))
            self.deadlines.arrived(rid, time.monotonic())
        frames = getattr(message.data, "codes", None)  # TalkerDelta / TalkerResult
        codes = torch.as_tensor(frames if frames is not None else torch.zeros(0, 0))
        if stream.count == stream.decoded_to:
            stream.waiting_since = next(self._arrivals)
        if message.kind is IncomingKind.NEW_REQUEST:
            stream.frames, stream.count = ([codes] if codes.numel() else []), int(codes.shape[0])
            stream.final = True
            stream.transcript = str(getattr(message.data, "transcript", ""))
        elif codes.numel():
            stream.frames.append(codes)
            stream.count += int(codes.shape[0])

    def _due(self) -> list[str]:
        """Streams with a chunk to vocode now, the longest waiting first."""
        due = []
        for rid, stream in self._streams.items():
            chunk = self.chunk_frames if stream.decoded_to else self.first_chunk_frames
            if stream.count > stream.decoded_to and (stream.final or stream.count - stream.decoded_to >= chunk):
                due.append(rid)
        return sorted(due, key=lambda rid: self._streams[rid].waiting_since)

    async def _vocode(self, rid: str, stream: _Stream) -> None:
        try:
            await self._synthesize(rid, stream)
        except Exception as exc:
            self._streams.pop(rid, None)
            self.deadlines.finished(rid)
            self.emit(
                OutgoingMessage(OutgoingKind.ERROR, rid, error=f"stage {self.stage_name}: vocoder failed: {exc!r}")
            )

    def _finish_done(self) -> None:
        """The result of every stream whose talker is done and whose frames are all vocoded."""
        for rid, stream in list(self._streams.items()):
            if not stream.final or stream.count > stream.decoded_to:
                continue
            del self._streams[rid]
            self.deadlines.finished(rid)
            audio = np.concatenate(stream.pieces) if stream.pieces else np.zeros(0, dtype=np.float32)
            result = AudioResult(samples=audio, sample_rate=SAMPLE_RATE, transcript=stream.transcript)
            self.emit(OutgoingMessage(OutgoingKind.RESULT, rid, result))

    async def _synthesize(self, rid: str, stream: _Stream) -> None:
        codes = torch.cat(stream.frames) if len(stream.frames) > 1 else stream.frames[0]
        stream.frames = [codes]
        end = stream.count
        loop = asyncio.get_running_loop()
        piece, emitted = await loop.run_in_executor(self._executor, self.vocode, codes, end, stream)
        if rid not in self._streams:  # aborted meanwhile
            return
        stream.decoded_to = end
        stream.emitted = emitted
        if stream.count > stream.decoded_to:  # frames came during the synthesis: waiting since now
            stream.waiting_since = next(self._arrivals)
        if piece.size:
            stream.pieces.append(piece)
            self.deadlines.sent(rid, piece.size / SAMPLE_RATE, time.monotonic())
            self.emit(OutgoingMessage(OutgoingKind.STREAM, rid, AudioChunk(samples=piece, sample_rate=SAMPLE_RATE)))

    def vocode(self, codes: torch.Tensor, end: int, stream: _Stream) -> tuple[np.ndarray, int]:
        """On the vocoder's thread: the samples owed for frames ``[.., end)`` (a family whose
        vocoder reads more of the request, as Qwen2.5-Omni's its voice, overrides it)."""
        return self.vocoder.samples(codes, end, stream.emitted)

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.deadlines.finished(request_id)

    def load(self) -> SchedulerLoad:
        return SchedulerLoad(running=len(self._streams), stream_buffers=len(self._streams))
