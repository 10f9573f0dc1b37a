"""A vLLM plugin that lets vLLM's Qwen3-Omni thinker load on an install without torchvision.

vLLM loads every ``vllm.general_plugins`` entry point (pyproject.toml names this one) in
each of its processes: the process that creates the engine, the model-inspection
subprocess, the engine core and its workers. On a CPU install torchvision is absent (its
PyPI wheel does not load against the CPU torch, so scripts/setup.sh removes it), and two
things then stop vLLM's ``qwen3_omni_moe_thinker`` before it starts:

- ``vllm/model_executor/models/qwen2_vl.py`` (imported by the Qwen3-Omni thinker) does
  ``from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize``; in
  transformers 5.24 that module is the torchvision image processor and fails with
  ``No module named 'torchvision'``. The module is pointed at transformers' PIL image
  processor, which has the same ``smart_resize`` and processes images the same way.
- ``Qwen3OmniMoeProcessor.from_pretrained`` builds a video processor, which requires
  torchvision (``Qwen2VLVideoProcessor requires the Torchvision library``). It is made to
  return omnictl's processor without video (:mod:`omnictl.models.qwen3_omni.processor`),
  the one omnictl's own Qwen3-Omni stages use.

With torchvision importable nothing is changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

ENTRY_POINT = "omnictl_qwen3_omni"
_TORCHVISION_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def register() -> None:
    """vLLM calls this once per process (``vllm.plugins.load_general_plugins``)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    _pil_image_processor_for_qwen2_vl()
    _qwen3_omni_processor_without_video()


def _pil_image_processor_for_qwen2_vl() -> None:
    if _TORCHVISION_IMAGE_PROCESSOR in sys.modules:
        return
    pil = importlib.import_module(_PIL_IMAGE_PROCESSOR)
    if not hasattr(pil, "Qwen2VLImageProcessor"):
        # vLLM also imports the class by its torchvision name from this module.
        setattr(pil, "Qwen2VLImageProcessor", pil.Qwen2VLImageProcessorPil)  # noqa: B010  # a module attribute mypy cannot know
    sys.modules[_TORCHVISION_IMAGE_PROCESSOR] = pil


def _qwen3_omni_processor_without_video() -> None:
    from transformers import Qwen3OmniMoeProcessor

    def from_pretrained(cls: type, path: Any, *args: Any, **kwargs: Any) -> Any:
        from omnictl.models.qwen3_omni.processor import load_processor

        # vLLM's extra arguments (revision, trust_remote_code, processor kwargs) have no
        # meaning for a local checkpoint's saved processor.
        return load_processor(path)

    Qwen3OmniMoeProcessor.from_pretrained = classmethod(from_pretrained)  # type: ignore[method-assign,assignment]  # replaced on purpose, see the module docstring


def require_plugin() -> None:
    """Raise one clear error where vLLM would not load this plugin (an install older than it)."""
    from importlib.metadata import entry_points

    from omnictl.exceptions import StartupError

    if importlib.util.find_spec("torchvision") is not None:
        return
    if not any(point.name == ENTRY_POINT for point in entry_points(group="vllm.general_plugins")):
        from importlib.metadata import distribution

        # Which metadata Python found: a stale omnictl.egg-info in the working directory
        # shadows the installed one, and reinstalling does not replace it.
        found = getattr(distribution("omnictl"), "_path", None)
        raise StartupError(
            f"vLLM will not load omnictl's plugin {ENTRY_POINT!r}: omnictl's metadata ({found}) predates it, "
            "and without it vLLM's Qwen3-Omni thinker needs torchvision",
            hint="reinstall omnictl: pip install -e . (scripts/setup.sh does); remove that metadata if it is a stale "
            "omnictl.egg-info in the checkout",
        )
