"""Mimi streamed with state (omnictl.models.mimi.streaming) against transformers' one call on the whole signal."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from omnictl.models.mimi.codec import codec_codebooks, load_mimi
from omnictl.models.mimi.streaming import StreamDecoder, StreamEncoder

from .conftest import speechlike

SECONDS = 12.0  # past the transformers' window (250 steps at 25 Hz: 10 s), where a cache must slide


@pytest.fixture(scope="module")
def mimi(tiny_moshi: Path) -> Iterator[Any]:
    # One thread, as a stage process on a 2-core machine gets (OMP_NUM_THREADS): a frame's
    # small convolutions are many times slower with two threads contending for loaded cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_mimi(tiny_moshi)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def whole(mimi: Any, tiny_moshi: Path) -> dict[str, Any]:
    """transformers' one-shot encode of the whole signal, and its one-shot decode."""
    audio = speechlike(SECONDS)
    with torch.inference_mode():
        codes = mimi.encode(torch.from_numpy(audio).reshape(1, 1, -1), num_quantizers=codec_codebooks(tiny_moshi))
        frames = codes.audio_codes[0].T
        wav = mimi.decode(frames.T[None]).audio_values.reshape(-1).numpy()
    return {"audio": audio, "frames": frames, "wav": wav}


def test_streaming_encoder_gives_the_one_shot_codes_exactly(mimi: Any, whole: dict[str, Any]) -> None:
    """Pieces of any length (a frame is 1,920 samples; these straddle frames, some are under one)."""
    encoder = StreamEncoder(mimi, whole["frames"].shape[1])
    audio, made, at = whole["audio"], [], 0
    sizes = np.random.default_rng(3).integers(1, 6000, size=len(whole["audio"]))
    for size in sizes:
        made.append(encoder.push(audio[at : at + size]))
        at += int(size)
        if at >= len(audio):
            break
    codes = torch.cat(made)
    assert codes.shape == whole["frames"].shape  # 12 s: 150 frames, none missing
    assert torch.equal(codes, whole["frames"])
    assert encoder.pending_samples == len(audio) % 1920


def test_streaming_decoder_gives_the_one_shot_waveform(mimi: Any, whole: dict[str, Any]) -> None:
    decoder = StreamDecoder(mimi)
    frames = whole["frames"]
    # A frame at a time, then a few at once: the state carries across either.
    pieces = [decoder.push(frames[i : i + 1]) for i in range(100)]
    pieces += [decoder.push(frames[i : i + 3]) for i in range(100, frames.shape[0], 3)]
    assert all(piece.size == 1920 for piece in pieces[:100])
    wav = np.concatenate(pieces)
    assert wav.shape == whole["wav"].shape
    np.testing.assert_allclose(wav, whole["wav"], atol=1e-5)


def test_a_stream_of_no_frames_decodes_to_no_samples(mimi: Any) -> None:
    assert StreamDecoder(mimi).push(torch.zeros(0, 8, dtype=torch.long)).size == 0
    assert StreamEncoder(mimi, 8).push(np.zeros(100, dtype=np.float32)).shape == (0, 8)
