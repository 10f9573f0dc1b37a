"""The Qwen3-Omni thinker on vLLM (``factory_args.engine: vllm``), for text prompts.

vLLM's own ``qwen3_omni_moe_thinker`` runs the checkpoint's thinker (MoE included, on
CPUs too), started with ``language_model_only``: the engine takes token ids and no media.
The stage still sits behind ``mm_aggregate`` like the HF thinker and reads the prompt's
token ids from its output (``prompt_ids``); for a text prompt the aggregate's 3-D mrope
positions are the plain positions vLLM computes itself, so the answers are the HF
thinker's token for token (tests/models/qwen3_omni/test_vllm_thinker.py).

What it does not do, and why (docs/engine.md):

- images and audio: a prompt with media placeholders is refused with a 400 naming
  ``engine: hf``. vLLM would have to take the encoders' output as multimodal embeddings,
  and with torchvision absent its multimodal processor stops at the video processor
  (``vllm/multimodal/processing/context.py``, ``get_supported_mm_processor_kwargs``);
- the hidden states of media positions, which the talker's prompt takes for images and
  audio: vLLM hands out hidden states only once a request has finished (docs/engine.md).
  A text prompt has no such position: the talker reads the thinker's token embeddings
  there, which it computes itself, so this stage sends it the same ``talker_prefix`` the
  HF thinker sends for a text prompt (the prompt's ids, no media hidden states) and the
  topologies with a talker run on vLLM for text prompts too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from omnictl.exceptions import InvalidRequest
from omnictl.models.qwen3_omni.payloads import ThinkerDelta, ThinkerResult, extend
from omnictl.models.qwen3_omni.weights import check_model_path, load_config
from omnictl.schedulers.vllm_engine import VllmOptions, VllmScheduler, require_vllm
from omnictl.schedulers.vllm_plugin import require_plugin


class VllmThinkerScheduler(VllmScheduler):
    """:class:`VllmScheduler` on a Qwen3-Omni checkpoint, prompted by ``mm_aggregate``'s output."""

    def __init__(self, model_path: str | Path | None, options: VllmOptions, *, stream_every: int = 1) -> None:
        require_vllm()
        require_plugin("Qwen3OmniMoeProcessor")  # its processor without video: pyproject.toml registers it
        path = check_model_path(model_path)
        config = load_config(path)
        thinker = config.thinker_config
        self.media_token_ids = {
            int(thinker.audio_token_id): "audio",
            int(thinker.image_token_id): "image",
            int(thinker.video_token_id): "video",
        }
        self.hidden_size = int(thinker.text_config.hidden_size)
        self._talker_prefixes: dict[str, dict[str, Any]] = {}
        super().__init__(
            str(path),
            options,
            stream_every=stream_every,
            extra_stop_token_ids=[int(config.im_end_token_id)],
            model_args={"language_model_only": True},
        )

    def prompt_ids(self, inputs: Any) -> list[int]:
        if not isinstance(inputs, Mapping) or "prompt_ids" not in inputs:
            keys = sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__
            raise InvalidRequest(f"thinker input lacks 'prompt_ids': it takes mm_aggregate's output, got {keys}")
        value = inputs["prompt_ids"]
        ids = [int(i) for i in (value.reshape(-1).tolist() if hasattr(value, "reshape") else value)]
        media = sorted({self.media_token_ids[i] for i in ids if i in self.media_token_ids})
        if media:
            raise InvalidRequest(
                f"this thinker runs on vLLM for text only, and the request has {' and '.join(media)} in it: "
                "serve a topology whose thinker has factory_args.engine: hf for images and audio",
                field="messages",
            )
        if not ids:
            raise InvalidRequest("model input: prompt_ids is empty", field="messages")
        return ids

    def on_accept(self, request_id: str, inputs: Any, prompt_ids: list[int]) -> None:
        # What ThinkerRunner.prefill hands the talker for a text prompt: no media positions,
        # so no hidden states.
        prefix: dict[str, Any] = {
            "prompt_ids": torch.tensor(prompt_ids, dtype=torch.long),
            "mm_hidden": torch.zeros(0, self.hidden_size),
        }
        if "voice" in inputs:
            prefix["voice"] = inputs["voice"]
        self._talker_prefixes[request_id] = prefix

    def on_output(self, request_id: str, data: Any, *, final: bool) -> Any:
        prefix = self._talker_prefixes.pop(request_id, None)
        return data if prefix is None else extend(data, ThinkerDelta, ThinkerResult, talker_prefix=prefix)

    def on_drop(self, request_id: str) -> None:
        self._talker_prefixes.pop(request_id, None)
