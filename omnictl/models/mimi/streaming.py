"""Mimi, streamed: audio to code frames and code frames to audio, a frame at a time, with state.

Mimi is causal end to end (its convolutions and transposed convolutions look back only,
its transformers attend to the past within a window of 250 steps), so a stream cut into
any pieces gives what one call on the whole signal gives, provided each piece carries what
the layers before it left behind:

- :class:`StreamEncoder` keeps transformers' own streaming state (``MimiModel.encode``
  with ``use_streaming``: each causal convolution's left padding, the encoder
  transformer's KV cache) and encodes whole frames (1,920 samples at 24 kHz) as they
  complete; the codes equal one ``encode`` of the whole signal exactly (tests/models/mimi).
- :class:`StreamDecoder` does the same for decoding, which transformers does not stream:
  each causal convolution keeps the last ``kernel - stride`` inputs it saw, each
  transposed convolution the tail of its output that the next frame's inputs add to
  (overlap-add), the decoder transformer its KV cache. Each frame costs the same, however
  long the stream; the samples equal one ``decode`` of all frames within float error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class StreamEncoder:
    """One stream's encoder state over a ``MimiModel`` (eval, on its device)."""

    def __init__(self, model: Any, codebooks: int) -> None:
        self.model = model
        self.codebooks = codebooks
        config = model.config
        self.samples_per_frame = int(round(config.sampling_rate / config.frame_rate))
        self.device = next(model.parameters()).device
        self._pending = np.zeros(0, dtype=np.float32)
        self._cache: Any = None  # the encoder transformer's KV cache
        self._padding: Any = None  # every causal convolution's left context

    @torch.inference_mode()
    def push(self, samples: np.ndarray) -> torch.Tensor:
        """Codes ``[frames, codebooks]`` (int64, CPU) of every frame that ``samples`` completes
        (none: ``[0, codebooks]``); a partial frame waits for the next push."""
        pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = len(pending) // self.samples_per_frame * self.samples_per_frame
        self._pending = pending[whole:]
        if whole == 0:
            return torch.zeros(0, self.codebooks, dtype=torch.long)
        audio = torch.from_numpy(np.ascontiguousarray(pending[:whole])).reshape(1, 1, -1).to(self.device)
        out = self.model.encode(
            audio,
            num_quantizers=self.codebooks,
            encoder_cache=self._cache,
            padding_cache=self._padding,
            use_streaming=True,
        )
        self._cache, self._padding = out.encoder_cache, out.padding_cache
        return out.audio_codes[0].T.contiguous().cpu()

    @property
    def pending_samples(self) -> int:
        """Samples waiting for their frame to complete."""
        return len(self._pending)


class StreamDecoder:
    """One stream's decoder state over a ``MimiModel`` (eval, on its device)."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

        self.model = model
        self._conv_types = (MimiConv1d, MimiConvTranspose1d, MimiResnetBlock)
        decoder = model.decoder
        self.decoder = decoder
        self.device = next(model.parameters()).device
        self._cache = DynamicCache(config=decoder.config)
        self._left: dict[int, torch.Tensor] = {}  # id(causal conv) -> its last kernel - stride inputs
        self._tail: dict[int, torch.Tensor] = {}  # id(transposed conv) -> output the next inputs add to (no bias)

    def _conv(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        pad = int(layer.padding_total)
        left = self._left.get(id(layer))
        if left is None:  # the stream's start: what one call pads the whole signal with
            if layer.pad_mode == "replicate":
                left = x[..., :1].expand(-1, -1, pad)
            elif layer.pad_mode == "constant":
                left = x.new_zeros(x.shape[0], x.shape[1], pad)
            else:
                raise ValueError(f"Mimi streaming decode: pad_mode {layer.pad_mode!r} is not causal padding")
        if int(layer.stride) != 1:
            raise ValueError("Mimi streaming decode: a strided convolution in the decoder is not supported")
        joined = torch.cat([left, x], dim=-1)
        self._left[id(layer)] = joined[..., joined.shape[-1] - pad :]
        return layer.conv(joined)

    def _conv_transpose(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        conv = layer.conv
        stride = int(conv.stride[0])
        if layer.padding_left != 0 or layer.padding_right != conv.kernel_size[0] - stride:
            raise ValueError("Mimi streaming decode: only fully right-trimmed (causal) transposed convolutions stream")
        y = conv(x)  # [(n - 1) * stride + kernel] samples, bias on each
        tail = self._tail.get(id(layer))
        if tail is not None:
            y = torch.cat([y[..., : tail.shape[-1]] + tail, y[..., tail.shape[-1] :]], dim=-1)
        done = x.shape[-1] * stride
        rest = y[..., done:]
        if conv.bias is not None:
            rest = rest - conv.bias.reshape(1, -1, 1)  # the next inputs' output brings its own bias
        self._tail[id(layer)] = rest
        return y[..., :done]

    def _layers(self, layers: Any, x: torch.Tensor) -> torch.Tensor:
        conv1d, conv_transpose, resnet = self._conv_types
        for layer in layers:
            if isinstance(layer, conv1d):
                x = self._conv(layer, x)
            elif isinstance(layer, conv_transpose):
                x = self._conv_transpose(layer, x)
            elif isinstance(layer, resnet):
                residual = (
                    layer.shortcut(x) if not isinstance(layer.shortcut, conv1d) else self._conv(layer.shortcut, x)
                )
                x = residual + self._layers(layer.block, x)
            else:  # an activation: no state
                x = layer(x)
        return x

    @torch.inference_mode()
    def push(self, codes: torch.Tensor) -> np.ndarray:
        """Float32 samples of the next code frames ``[frames, codebooks]`` (``samples_per_frame`` each)."""
        frames = torch.as_tensor(codes, dtype=torch.long).to(self.device)
        if frames.ndim != 2:
            raise ValueError(f"Mimi frames must be [frames, codebooks], got {list(frames.shape)}")
        if frames.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        latents = self.model.quantizer.decode(frames.T[None])
        decoder = self.decoder
        if decoder.upsample is not None:
            latents = self._conv_transpose(decoder.upsample, latents)
        hidden = decoder.decoder_transformer(latents.transpose(1, 2), cache=self._cache, use_cache=True)
        audio = self._layers(decoder.decoder_seanet.layers, hidden.last_hidden_state.transpose(1, 2))
        return audio.reshape(-1).float().cpu().numpy()
