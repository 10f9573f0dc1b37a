"""One resampler with a quality setting: ``high`` (FFmpeg's) and ``fast`` (linear, or the
exact 3:2 decimation from 24 to 16 kHz)."""

from __future__ import annotations

import numpy as np
import pytest

from omnictl.audio import resample


def tone(seconds: float, rate: int, hz: float) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


@pytest.mark.parametrize("quality", ["high", "fast"])
@pytest.mark.parametrize(("rate", "target"), [(24_000, 16_000), (16_000, 24_000), (22_050, 24_000), (48_000, 8_000)])
def test_each_quality_keeps_a_tone_at_the_length_the_ratio_says(quality: str, rate: int, target: int) -> None:
    out = resample(tone(1.0, rate, 440.0), rate, target, quality)  # type: ignore[arg-type]
    assert out.dtype == np.float32 and out.size == round(rate * target / rate)
    assert abs(int(np.argmax(np.abs(np.fft.rfft(out)))) - 440) <= 1  # 1 Hz bins over one second
    if quality == "high":  # sample for sample; linear interpolation stretches by a sample over the whole
        expected = tone(1.0, target, 440.0)
        error = np.sqrt(np.mean((out[200:-200] - expected[200:-200]) ** 2)) / np.sqrt(np.mean(expected**2))
        assert error < 0.01, error


def test_high_removes_what_the_target_cannot_hold_and_fast_24_to_16_does_too() -> None:
    high = tone(1.0, 24_000, 10_000.0)  # above the 8 kHz Nyquist of 16 kHz
    assert np.abs(resample(high, 24_000, 16_000, "high")[500:-500]).max() < 0.02
    assert np.abs(resample(high, 24_000, 16_000, "fast")[500:-500]).max() < 0.1  # 33 taps: good enough for VAD


def test_same_rate_is_the_same_array_and_a_bad_quality_is_named() -> None:
    samples = tone(0.1, 16_000, 440.0)
    assert resample(samples, 16_000, 16_000) is samples
    with pytest.raises(ValueError, match="quality must be one of high, fast, got 'best'"):
        resample(samples, 16_000, 24_000, "best")  # type: ignore[arg-type]


def frames_of(channels: np.ndarray, size: int = 960) -> list[object]:
    import av

    out = []
    for start in range(0, channels.shape[1], size):  # 20 ms frames at 48 kHz, as Opus decodes them
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(channels[:, start : start + size]), format="fltp",
                                           layout="mono" if channels.shape[0] == 1 else "stereo")
        frame.sample_rate = 48_000
        out.append(frame)
    return out


def test_the_frame_resampler_keeps_its_state_across_frames_and_mixes_channels_down() -> None:
    from omnictl.audio import FrameResampler

    mono = tone(1.0, 48_000, 440.0)
    resampler = FrameResampler(24_000)
    out = np.concatenate([*(resampler.push(f) for f in frames_of(mono[None, :])), resampler.flush()])
    assert out.dtype == np.float32 and abs(out.size - 24_000) <= 32
    # One filter over the whole stream: the frame boundaries leave no seams.
    whole = resample(mono, 48_000, 24_000)
    assert np.abs(out[200:20_000] - whole[200:20_000]).max() < 1e-3
    stereo = FrameResampler(24_000)
    mixed = np.concatenate([*(stereo.push(f) for f in frames_of(np.stack([mono, mono]))), stereo.flush()])
    assert mixed.ndim == 1 and mixed.size == out.size  # FFmpeg's downmix (each channel at -3 dB), as before


@pytest.mark.parametrize("quality", ["high", "fast"])
@pytest.mark.parametrize(("rate", "target"), [(24_000, 16_000), (16_000, 24_000), (22_050, 24_000), (48_000, 8_000)])
def test_no_samples_resample_to_no_samples(quality: str, rate: int, target: int) -> None:
    # A clause with nothing to pronounce ("...", an emoji) is 0 samples: fast 24 -> 16 kHz
    # (the echo guard's and the VAD's) raised 'v cannot be empty' and failed the whole answer.
    out = resample(np.zeros(0, np.float32), rate, target, quality)  # type: ignore[arg-type]
    assert out.dtype == np.float32 and out.shape == (0,)
