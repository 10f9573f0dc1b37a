"""Stage factories for Qwen3-ASR (``topologies/qwen3-asr.yaml``).

preprocessing (prompt and log-mel features) -> audio_encoder (audio tower + projector)
-> decoder (the Qwen3 decoder on the autoregressive scheduler, streaming its tokens)
-> transcript (the ``transcript`` terminal). Each factory takes ``model_path`` (a local
checkpoint directory; nothing is downloaded) and, where weights run, ``device``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from omnictl.inputs import ChatRequest
from omnictl.models.qwen3_asr.decoder import DecoderRunner, DecoderScheduler
from omnictl.models.qwen3_asr.frontend import AudioEncoder, Preprocessor
from omnictl.models.qwen3_asr.transcript import TranscriptScheduler

# Greedy, as the released model is meant to be decoded; a request's own sampling fields
# (the Python API's `sampling`) are laid over these.
DEFAULT_MAX_TOKENS = 256


def preprocessing(model_path: str | Path | None = None) -> Callable[[ChatRequest | Mapping[str, Any]], dict[str, Any]]:
    """The entry stage: takes the typed request (HTTP) or the request dict (Python API)."""
    return Preprocessor(model_path)


def audio_encoder(
    model_path: str | Path | None = None, device: str | None = None
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    return AudioEncoder(model_path, device)


def decoder(
    model_path: str | Path | None = None,
    device: str | None = None,
    stream_every: int = 1,
    max_batch: int = 32,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    prefill_chunk: int = 512,
) -> DecoderScheduler:
    """``max_tokens``: the longest transcript, in tokens, for a request that sets none
    (about 13 prompt positions per second of audio come on top)."""
    if max_tokens < 1:
        raise ValueError(f"factory_args.max_tokens: must be >= 1, got {max_tokens}")
    return DecoderScheduler(
        DecoderRunner(model_path, device),
        stream_every=stream_every,
        max_batch=max_batch,
        default_sampling={"temperature": 0.0, "max_tokens": max_tokens},
        prefill_chunk=prefill_chunk,
    )


def transcript(model_path: str | Path | None = None) -> TranscriptScheduler:
    return TranscriptScheduler(model_path)
