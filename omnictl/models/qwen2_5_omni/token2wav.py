"""``token2wav``: the talker's codes to a 24 kHz waveform, streamed, and the audio terminal.

Qwen2.5-Omni's token2wav is a DiT that turns codes into a mel spectrogram by integrating an
ODE (Runge-Kutta, 10 time points) from Gaussian noise, conditioned on the speaker's
reference mel and embedding, then a BigVGAN vocoder. transformers runs it once on the whole
answer, its noise drawn from the global generator (``torch.randn``). Here:

- the noise is drawn from a generator seeded with ``noise_seed`` (transformers' draw after
  ``torch.manual_seed(noise_seed)``), and is the same for a position however many codes
  are drawn for (:class:`NoiseStream`): a request decoded whole gives transformers'
  waveform for the same codes;
- the codes are decoded in windows as they come (Qwen3-Omni's :class:`Code2WavScheduler`
  does the chunking): ``chunk_frames`` new codes with ``left_context`` earlier ones in
  front. The DiT attends ahead and behind by blocks, so a window's samples are close to,
  not equal to, a whole decode's; ``chunk_frames: 0`` decodes once the talker finished,
  exactly as transformers does (the first audio then waits for the whole answer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from omnictl.exceptions import InvalidRequest
from omnictl.models.qwen2_5_omni.talker import DEFAULT_SPEAKER
from omnictl.models.qwen2_5_omni.weights import load_talker
from omnictl.models.qwen3_omni.code2wav import Code2WavScheduler, _Stream
from omnictl.playback.policy import DEFAULT_POLICY, DEFAULT_TTFP_TARGET_S

ODE_STEPS = 10  # transformers' defaults for Qwen2_5OmniToken2WavModel.forward
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0
WHOLE = 1 << 30  # chunk_frames for "decode once the talker finished"


class NoiseStream:
    """The DiT's initial noise for mel positions ``[0, n)``, equal to
    ``torch.randn(1, n, mel_dim)`` right after ``manual_seed(seed)`` for every ``n``.

    torch fills a normal tensor of 16 or more values block by block (16 uniforms, then
    Box-Muller on them), so a longer draw starts with a shorter one's values when the
    shorter one is a whole number of blocks: ``mel_dim`` must be a multiple of 16 (80 in
    the released model)."""

    def __init__(self, seed: int, mel_dim: int) -> None:
        if mel_dim % 16:
            raise ValueError(
                f"token2wav: the DiT's mel_dim must be a multiple of 16 to stream its noise, got {mel_dim}"
            )
        self.seed = seed
        self.mel_dim = mel_dim

    def take(self, start: int, end: int) -> torch.Tensor:
        """Noise rows ``[start, end)``, ``[1, end - start, mel_dim]``."""
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn(1, end, self.mel_dim, generator=generator)[:, start:end]


class Token2Wav:
    """Decodes a window of codes and returns the samples owed after ``emitted``."""

    def __init__(
        self, model_path: str | Path | None, device: str | None = None, *, left_context: int = 24, noise_seed: int = 0
    ) -> None:
        parts = load_talker(model_path, device)
        self.model = parts.token2wav
        self.speakers = {name.lower(): params for name, params in parts.speakers.items()}
        self.device = next(self.model.parameters()).device
        dit = self.model.code2wav_dit_model
        self.repeats = int(dit.repeats)
        bigvgan = self.model.config.bigvgan_config
        self.samples_per_frame = self.repeats * int(np.prod(bigvgan.upsample_rates))
        self.left_context = left_context
        self.noise = NoiseStream(noise_seed, int(dit.mel_dim))

    @torch.inference_mode()
    def samples(self, codes: torch.Tensor, end: int, emitted: int, voice: str | None = None) -> tuple[np.ndarray, int]:
        """Samples from ``emitted`` up to what codes ``[.., end)`` determine; and the new ``emitted``."""
        speaker = self.speakers.get((voice or DEFAULT_SPEAKER).lower())
        if speaker is None:
            raise InvalidRequest(f"voice: {voice!r} is not a speaker of this checkpoint", field="voice")
        first_owed = emitted // self.samples_per_frame
        start = max(0, first_owed - self.left_context)
        window = codes[start:end].reshape(1, -1).to(self.device)
        noise = self.noise.take(start * self.repeats, end * self.repeats).to(self.device)
        mel = self._mel(
            window, noise, speaker["cond"].to(self.device).float(), speaker["ref_mel"].to(self.device).float()
        )
        wav = self.model.code2wav_bigvgan_model(mel).reshape(-1).float().cpu().numpy()
        offset = start * self.samples_per_frame
        return wav[emitted - offset :].astype(np.float32), offset + wav.shape[0]

    def _mel(self, code: torch.Tensor, noise: torch.Tensor, cond: torch.Tensor, ref_mel: torch.Tensor) -> torch.Tensor:
        """``Qwen2_5OmniToken2WavDiTModel.sample`` from the given initial ``noise``."""
        dit = self.model.code2wav_dit_model
        duration = code.shape[1] * self.repeats
        if duration > dit.config.max_position_embeddings:
            raise InvalidRequest(f"token2wav: {code.shape[1]} codes are more than the DiT takes at once")
        cond = cond.expand(1, -1).unsqueeze(1).repeat(1, duration, 1)
        ref_mel = ref_mel.expand(1, -1, -1)

        def ode(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            out = dit(
                hidden_states=state,
                quantized_code=code,
                speaker_embedding=cond,
                condition_vector=ref_mel,
                time_step=time_step,
                apply_cfg=True,
            )
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * GUIDANCE_SCALE

        times = torch.linspace(0, 1, ODE_STEPS, device=code.device, dtype=cond.dtype)
        times += SWAY_COEFFICIENT * (torch.cos(torch.pi / 2 * times) - 1 + times)
        trajectory = RungeKutta4ODESolver(function=ode, initial_value=noise.to(ref_mel.dtype)).integrate(times)
        return trajectory[-1].permute(0, 2, 1)


class Token2WavScheduler(Code2WavScheduler):
    """Qwen3-Omni's streaming vocoder scheduler around :class:`Token2Wav` (its voice read
    from the request)."""

    vocoder: Token2Wav  # type: ignore[assignment]  # the same protocol, one argument more

    def vocode(self, codes: torch.Tensor, end: int, stream: _Stream) -> tuple[np.ndarray, int]:
        return self.vocoder.samples(codes, end, stream.emitted, voice=stream.voice)


def token2wav_scheduler(
    model_path: str | Path | None,
    device: str | None,
    *,
    chunk_frames: int,
    first_chunk_frames: int,
    left_context: int,
    noise_seed: int,
    audio_policy: str = DEFAULT_POLICY,
    ttfp_target_s: float = DEFAULT_TTFP_TARGET_S,
) -> Token2WavScheduler:
    if chunk_frames < 0 or first_chunk_frames < 0:
        raise ValueError("token2wav: chunk_frames and first_chunk_frames must be >= 0 (0: decode the whole answer)")
    chunk = chunk_frames or WHOLE
    return Token2WavScheduler(
        Token2Wav(model_path, device, left_context=left_context, noise_seed=noise_seed),
        chunk_frames=chunk,
        first_chunk_frames=(first_chunk_frames or chunk) if chunk_frames else WHOLE,
        audio_policy=audio_policy,
        ttfp_target_s=ttfp_target_s,
    )
