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
- the talker: its first input is the thinker's hidden states for the prompt, which this
  engine does not hand out while it generates. The talker fails such a request naming
  the missing ``talker_prefix``; the topologies with a talker keep ``engine: hf``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from omnictl.exceptions import InvalidRequest
from omnictl.models.qwen3_omni.weights import check_model_path, load_config
from omnictl.schedulers.vllm_engine import VllmOptions, VllmScheduler, require_vllm
from omnictl.schedulers.vllm_plugin import require_plugin


class VllmThinkerScheduler(VllmScheduler):
    """:class:`VllmScheduler` on a Qwen3-Omni checkpoint, prompted by ``mm_aggregate``'s output."""

    def __init__(self, model_path: str | Path | None, options: VllmOptions, *, stream_every: int = 1) -> None:
        require_vllm()
        require_plugin()
        path = check_model_path(model_path)
        config = load_config(path)
        thinker = config.thinker_config
        self.media_token_ids = {
            int(thinker.audio_token_id): "audio",
            int(thinker.image_token_id): "image",
            int(thinker.video_token_id): "video",
        }
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
