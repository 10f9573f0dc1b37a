"""token2wav's noise and windows, in process on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnictl.models.qwen2_5_omni.token2wav import NoiseStream, Token2Wav


def test_the_noise_of_a_position_is_transformers_draw_however_long_the_draw() -> None:
    torch.manual_seed(3)
    drawn = torch.randn(1, 37, 16)  # what transformers' DiT draws for 37 mel frames
    noise = NoiseStream(3, 16)
    assert torch.equal(noise.take(0, 37), drawn)
    assert torch.equal(noise.take(10, 20), drawn[:, 10:20])
    assert torch.equal(noise.take(5, 90)[:, :32], drawn[:, 5:37])  # a longer draw starts the same
    with pytest.raises(ValueError, match="multiple of 16"):
        NoiseStream(0, 20)


@pytest.fixture(scope="module")
def vocoder(tiny_qwen25: Path) -> Token2Wav:
    return Token2Wav(str(tiny_qwen25), "cpu", left_context=4)


def test_windows_give_every_codes_samples_near_the_whole_decode(vocoder: Token2Wav) -> None:
    codes = torch.randint(0, 64, (12, 1), generator=torch.Generator().manual_seed(0))
    whole, end = vocoder.samples(codes, 12, 0)
    assert end == whole.size == 12 * vocoder.samples_per_frame
    pieces, emitted = [], 0
    for stop in (2, 6, 10, 12):
        piece, emitted = vocoder.samples(codes, stop, emitted)
        pieces.append(piece)
    windowed = np.concatenate(pieces)
    assert emitted == windowed.size == whole.size
    # The first window covers the start alone, so its samples differ from the whole decode's
    # only by what the DiT attends ahead; the level is the whole decode's.
    assert not np.allclose(windowed, whole, atol=0, rtol=1e-6)
    assert 0.5 < float(np.std(windowed) / np.std(whole)) < 2.0
    again, _ = vocoder.samples(codes, 2, 0)
    np.testing.assert_array_equal(again, pieces[0])  # deterministic: the noise is seeded


def test_an_unknown_voice_is_refused_naming_it(vocoder: Token2Wav) -> None:
    from omnictl.exceptions import InvalidRequest

    with pytest.raises(InvalidRequest, match="'nobody'"):
        vocoder.samples(torch.zeros(2, 1, dtype=torch.long), 2, 0, voice="nobody")
