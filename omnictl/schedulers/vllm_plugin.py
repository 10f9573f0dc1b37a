"""A vLLM plugin that lets vLLM's multimodal models (Qwen3-Omni's thinker) load on an install
without torchvision.

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
  torchvision (``Qwen2VLVideoProcessor requires the Torchvision library``). A model
  registers a processor of its own for such a class, without video: an entry point in the
  group :data:`PROCESSORS` named after transformers' class, whose object loads a local
  checkpoint's processor (pyproject.toml registers Qwen3-Omni's,
  ``omnictl/models/qwen3_omni/processor.py``). The class's ``from_pretrained`` is made to
  return it. Entry points, not imports: the schedulers never import the models
  (tests/test_layering.py), and vLLM's processes load nothing else of omnictl's.

With torchvision importable nothing is changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any

ENTRY_POINT = "omnictl_qwen3_omni"
# Entry points: transformers' processor class, by name -> a loader of a local checkpoint's
# processor without video, ``(path) -> processor`` (the model's, registered in pyproject.toml).
PROCESSORS = "omnictl.vllm_processors"
_TORCHVISION_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def register() -> None:
    """vLLM calls this once per process (``vllm.plugins.load_general_plugins``)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    _pil_image_processor_for_qwen2_vl()
    _registered_processors_without_video()


def _pil_image_processor_for_qwen2_vl() -> None:
    if _TORCHVISION_IMAGE_PROCESSOR in sys.modules:
        return
    pil = importlib.import_module(_PIL_IMAGE_PROCESSOR)
    if not hasattr(pil, "Qwen2VLImageProcessor"):
        # vLLM also imports the class by its torchvision name from this module.
        setattr(pil, "Qwen2VLImageProcessor", pil.Qwen2VLImageProcessorPil)  # noqa: B010  # a module attribute mypy cannot know
    sys.modules[_TORCHVISION_IMAGE_PROCESSOR] = pil


def _registered_processors_without_video() -> None:
    import transformers

    for point in entry_points(group=PROCESSORS):
        processor_class = getattr(transformers, point.name, None)
        if processor_class is None:  # a model for a transformers this install does not have
            continue
        _from_pretrained_with(processor_class, point)


def _from_pretrained_with(processor_class: type, point: EntryPoint) -> None:
    def from_pretrained(cls: type, path: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM's extra arguments (revision, trust_remote_code, processor kwargs) have no
        # meaning for a local checkpoint's saved processor.
        return point.load()(path)

    processor_class.from_pretrained = classmethod(from_pretrained)  # type: ignore[attr-defined]  # replaced on purpose, see the module docstring


def require_plugin(processor: str | None = None) -> None:
    """Raise one clear error where vLLM would not load this plugin, or it would not find the
    model's ``processor`` (transformers' class name) among :data:`PROCESSORS`: an install
    whose metadata is older than either."""
    from omnictl.exceptions import StartupError

    if importlib.util.find_spec("torchvision") is not None:
        return
    plugin = any(point.name == ENTRY_POINT for point in entry_points(group="vllm.general_plugins"))
    if (
        plugin
        and processor is not None
        and not any(point.name == processor for point in entry_points(group=PROCESSORS))
    ):
        from importlib.metadata import distribution

        found = getattr(distribution("omnictl"), "_path", None)
        raise StartupError(
            f"vLLM will not find omnictl's {processor} without video: omnictl's metadata ({found}) registers none "
            f"in {PROCESSORS!r}, and without it vLLM's {processor} needs torchvision",
            hint="reinstall omnictl: pip install -e . (scripts/setup.sh does); remove that metadata if it is a stale "
            "omnictl.egg-info in the checkout",
        )
    if not plugin:
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
