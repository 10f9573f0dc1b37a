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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from omnictl.models.mimi.codec import MimiCodec
from omnictl.outputs import AudioChunk, AudioResult
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
