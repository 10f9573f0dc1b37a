"""Mimi's two stages, for any family that speaks or listens through Mimi (CSM, Moshi).

- :func:`decoder`: the streaming audio terminal. Code frames arrive in its upstream's
  stream chunks (``{"codes": [n, codebooks]}``); every ``chunk_frames`` new frames are
  decoded with up to ``left_context`` earlier frames in front, and the new samples go out
  as an :class:`~omnictl.outputs.AudioChunk`. Mimi is causal (its convolutions, its
  transposed convolution and its attention look back only), so a frame's samples depend
  on the frames before it alone; with every earlier frame in context they equal one
  decode of the whole sequence, and with ``left_context`` frames (Mimi's attention window
  is 250) the difference is below what PCM16 can carry (tests/models/mimi).
- :func:`encoder`: audio (mono float samples at Mimi's 24 kHz) to code frames, a plain
  function stage: ``{"audio": samples}`` in, ``{"codes": [frames, codebooks]}`` out.
- :func:`stream_encoder` / :func:`stream_decoder`: the same two with state across a whole
  stream (:mod:`omnictl.models.mimi.streaming`): a session-long input encoded frame by frame
  as it arrives (Moshi's entry), frames decoded at a constant cost each, however long the
  session (Moshi's audio terminal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.models.mimi.codec import MimiCodec, codec_codebooks
from omnictl.models.mimi.session import SessionScheduler
from omnictl.models.mimi.streaming import StreamDecoder, StreamEncoder
from omnictl.outputs import AudioChunk, AudioResult
from omnictl.schedulers.base import IncomingKind, IncomingMessage
from omnictl.schedulers.streaming import FinishOn, StreamingScheduler, Window


def _frames(data: Any) -> torch.Tensor:
    """The code frames of an upstream's chunk or result (a mapping with ``codes``)."""
    codes = data["codes"] if isinstance(data, Mapping) else data.codes
    return torch.as_tensor(codes, dtype=torch.long).reshape(-1, torch.as_tensor(codes).shape[-1])


def decoder(
    model_path: str | Path | None = None,
    device: str | None = None,
    chunk_frames: int = 1,
    left_context: int = 250,
    finish_on: str = "request",
) -> StreamingScheduler:
    """The Mimi decoder stage. ``chunk_frames`` (default 1: a frame's 80 ms go out as soon
    as it is made); ``finish_on``: ``request`` when this stage is both a ``stream_to`` and a
    ``next`` target of its upstream (it ends on the upstream's result), ``stream_done`` when
    it is only a stream target."""
    if model_path is None:
        raise ValueError("factory_args.model_path: the Mimi decoder needs a local checkpoint (serve --model PATH)")
    if chunk_frames < 1 or left_context < 0:
        raise ValueError(f"need chunk_frames >= 1 and left_context >= 0, got {chunk_frames}, {left_context}")
    codec = MimiCodec(model_path, device)
    spf = codec.samples_per_frame

    def process(window: Window) -> AudioChunk | None:
        if len(window.new) == 0:
            return None
        wav = codec.decode(torch.cat([window.context, window.new]))
        new = wav[len(window.context) * spf :]
        return AudioChunk(samples=np.ascontiguousarray(new, dtype=np.float32), sample_rate=codec.sample_rate)

    def finish(_rid: str, _params: Mapping[str, Any], outputs: list[Any]) -> AudioResult:
        # No frame at all (the model ended at once) is an empty result, not a missing one.
        pieces = [output.samples for output in outputs]
        samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return AudioResult(samples=samples, sample_rate=codec.sample_rate)

    return StreamingScheduler(
        process,  # type: ignore[arg-type]  # an AudioChunk is emitted as it is, the audio terminal's contract
        left_context=left_context,
        chunk_size=chunk_frames,
        units=_frames,
        finish=finish,  # type: ignore[arg-type]  # returns the typed AudioResult an audio terminal must
        finish_on=FinishOn(finish_on),
    )


def encoder(
    model_path: str | Path | None = None, device: str | None = None
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The Mimi encoder stage: ``{"audio": samples at 24 kHz, ...}`` -> the same dict with ``codes``."""
    if model_path is None:
        raise ValueError("factory_args.model_path: the Mimi encoder needs a local checkpoint (serve --model PATH)")
    codec = MimiCodec(model_path, device)

    def run(data: Mapping[str, Any]) -> dict[str, Any]:
        if "audio" not in data:
            raise ValueError(
                f"the Mimi encoder needs 'audio' (mono samples at {codec.sample_rate} Hz); got {sorted(data)}"
            )
        return {**data, "codes": codec.encode(np.asarray(data["audio"], dtype=np.float32))}

    return run


class _EncoderSessions(SessionScheduler):
    """The streaming encoder stage: audio chunks in (the caller's streamed input), code frames out."""

    worker_name = "mimi-encoder"

    def __init__(self, codec: MimiCodec, codebooks: int) -> None:
        super().__init__()
        self.codec = codec
        self.codebooks = codebooks

    def open(self, request_id: str, params: Mapping[str, Any]) -> StreamEncoder:
        return StreamEncoder(self.codec.model, self.codebooks)

    def handle(self, request_id: str, state: StreamEncoder, message: IncomingMessage) -> None:
        if message.kind is IncomingKind.NEW_REQUEST and not _is_audio(message.data):
            raise InvalidRequest(
                "'input': this stage listens to audio streamed over the whole session (a /v1/realtime "
                "session, or Pipeline.submit(None, input_stream=True) and send()), not to a whole request",
                field="input",
            )
        if message.kind is IncomingKind.STREAM_CHUNK or message.kind is IncomingKind.NEW_REQUEST:
            if message.data is not None:
                codes = state.push(_samples(message.data, self.codec.sample_rate))
                if codes.shape[0]:
                    self.stream(request_id, {"codes": codes})
        if message.kind is not IncomingKind.STREAM_CHUNK:  # the stream's end, or a whole input
            # The input has ended: a partial last frame is not a frame (Moshi steps on whole frames).
            self.finish(request_id, {"dropped_samples": state.pending_samples})


def _is_audio(data: Any) -> bool:
    return isinstance(data, AudioChunk) or (isinstance(data, Mapping) and "audio" in data)


def _samples(data: Any, rate: int) -> np.ndarray:
    """Mono float samples at ``rate`` of a streamed input chunk: an AudioChunk, ``{"audio": samples}``,
    or a mapping of the request's parameters alone (no samples)."""
    if isinstance(data, AudioChunk):
        if data.sample_rate != rate:
            raise InvalidRequest(
                f"'input': Mimi listens at {rate} Hz; a streamed chunk is at {data.sample_rate} Hz "
                "(resample it before sending)",
                field="input",
            )
        return np.asarray(data.samples, dtype=np.float32).reshape(-1)
    if isinstance(data, Mapping):
        if "audio" not in data:
            # The session's opening chunk may carry only its parameters (``{"sampling": ...}``).
            return np.zeros(0, dtype=np.float32)
        got = data.get("sample_rate", rate)
        if got != rate:
            raise InvalidRequest(f"'sample_rate': Mimi listens at {rate} Hz, got {got}", field="sample_rate")
        return np.asarray(data["audio"], dtype=np.float32).reshape(-1)
    raise InvalidRequest(
        f"'input': a streamed chunk for Mimi must be an AudioChunk or {{'audio': samples}}, got {type(data).__name__}",
        field="input",
    )


def stream_encoder(
    model_path: str | Path | None = None, device: str | None = None, codebooks: int | None = None
) -> SessionScheduler:
    """The Mimi encoder as a streaming entry stage: the caller's streamed audio (24 kHz
    :class:`~omnictl.outputs.AudioChunk` s, any length) to ``{"codes": [frames, codebooks]}``
    stream chunks, one per whole 80 ms frame as soon as it completes, with state across the
    whole stream (:class:`~omnictl.models.mimi.streaming.StreamEncoder`). The result, when
    the input ends: ``{"dropped_samples": n}`` (a last partial frame). ``codebooks``: the
    checkpoint's (a Moshi checkpoint's ``num_codebooks``) when not given."""
    if model_path is None:
        raise ValueError("factory_args.model_path: the Mimi encoder needs a local checkpoint (serve --model PATH)")
    codec = MimiCodec(model_path, device)
    return _EncoderSessions(codec, codebooks or codec_codebooks(model_path))


class _DecoderSessions(SessionScheduler):
    """The streaming decoder stage: code frames in, 80 ms of audio per frame out."""

    worker_name = "mimi-decoder"

    def __init__(self, codec: MimiCodec, finish_on: FinishOn) -> None:
        super().__init__()
        self.codec = codec
        self.finish_on = finish_on

    def open(self, request_id: str, params: Mapping[str, Any]) -> tuple[StreamDecoder, list[np.ndarray]]:
        return StreamDecoder(self.codec.model), []

    def handle(self, request_id: str, state: tuple[StreamDecoder, list[np.ndarray]], message: IncomingMessage) -> None:
        decoder, pieces = state
        if message.kind is IncomingKind.STREAM_CHUNK:
            samples = decoder.push(_frames(message.data))
            if samples.size:
                pieces.append(samples)
                chunk = AudioChunk(samples=np.ascontiguousarray(samples), sample_rate=self.codec.sample_rate)
                self.stream(request_id, chunk)
            return
        ends = IncomingKind.STREAM_DONE if self.finish_on is FinishOn.STREAM_DONE else IncomingKind.NEW_REQUEST
        if message.kind is ends:
            samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
            self.finish(request_id, AudioResult(samples=samples, sample_rate=self.codec.sample_rate))


def stream_decoder(
    model_path: str | Path | None = None, device: str | None = None, finish_on: str = "request"
) -> SessionScheduler:
    """The Mimi decoder as a stateful streaming audio terminal: each stream chunk's frames
    (``{"codes": [n, codebooks]}``) decoded with the state the frames before left
    (:class:`~omnictl.models.mimi.streaming.StreamDecoder`: each frame costs the same,
    however long the session), sent on as an :class:`~omnictl.outputs.AudioChunk`. The
    result: the whole waveform. ``finish_on``: as :func:`decoder`'s."""
    if model_path is None:
        raise ValueError("factory_args.model_path: the Mimi decoder needs a local checkpoint (serve --model PATH)")
    return _DecoderSessions(MimiCodec(model_path, device), FinishOn(finish_on))
