"""omnictl's vLLM plugin in the test process, each test well under a second: what
``register`` changes where torchvision is absent (and that every change is undone after the
test), that it changes nothing where torchvision is importable, and ``require_plugin``
against this install's metadata and against a stale copy ahead of it on the path. The
same, as vLLM itself loads the plugin in a fresh interpreter, is test_vllm_plugin.py."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")

from transformers import Qwen3OmniMoeProcessor

from omnictl.exceptions import StartupError
from omnictl.models.qwen3_omni.processor import Qwen3OmniProcessorWithoutVideo
from omnictl.schedulers import vllm_plugin

TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


@pytest.fixture()
def restored(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Whatever register() changes process-wide is put back after the test; returns the PIL module."""
    pil = importlib.import_module(PIL_MODULE)
    monkeypatch.setitem(sys.modules, TORCHVISION_MODULE, None)  # recorded, so that undo restores its absence
    monkeypatch.delitem(sys.modules, TORCHVISION_MODULE)
    monkeypatch.setattr(pil, "Qwen2VLImageProcessor", None, raising=False)
    monkeypatch.delattr(pil, "Qwen2VLImageProcessor")
    monkeypatch.setattr(Qwen3OmniMoeProcessor, "from_pretrained",
                        inspect.getattr_static(Qwen3OmniMoeProcessor, "from_pretrained"))
    return pil


def torchvision_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return ModuleSpec(name, None) if name == "torchvision" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.fixture(scope="module")
def qwen_processor_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnictl.models.qwen3_omni.tiny import _build_processor, _build_tokenizer, _save_processor

    folder = tmp_path_factory.mktemp("qwen-processor")
    _save_processor(_build_processor(_build_tokenizer()), folder)
    return folder


def test_without_torchvision_register_points_vllm_at_the_pil_image_processor_and_drops_video(
        restored: types.ModuleType, qwen_processor_folder: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the plugin changes nothing")
    original = Qwen3OmniMoeProcessor.from_pretrained
    vllm_plugin.register()
    assert sys.modules[TORCHVISION_MODULE] is restored
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize

    assert smart_resize is restored.smart_resize
    assert Qwen2VLImageProcessor is restored.Qwen2VLImageProcessorPil  # vLLM imports it by this name
    assert Qwen3OmniMoeProcessor.from_pretrained != original
    # vLLM's extra arguments are taken and have no effect on a local folder.
    processor = Qwen3OmniMoeProcessor.from_pretrained(qwen_processor_folder, trust_remote_code=True, revision="main")
    assert isinstance(processor, Qwen3OmniProcessorWithoutVideo) and processor.video_processor is None
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    with pytest.raises(FileNotFoundError, match=f"Qwen3-Omni checkpoint directory not found: {tmp_path / 'nothing'}"):
        Qwen3OmniMoeProcessor.from_pretrained(tmp_path / "nothing")


def test_a_module_already_imported_is_left_as_it_is(restored: types.ModuleType,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    already = types.ModuleType(TORCHVISION_MODULE)
    monkeypatch.setitem(sys.modules, TORCHVISION_MODULE, already)
    vllm_plugin._pil_image_processor_for_qwen2_vl()
    assert sys.modules[TORCHVISION_MODULE] is already and not hasattr(restored, "Qwen2VLImageProcessor")


def test_a_pil_module_that_has_the_torchvision_name_keeps_its_own(restored: types.ModuleType,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    own = type("Qwen2VLImageProcessor", (), {})
    monkeypatch.setattr(restored, "Qwen2VLImageProcessor", own, raising=False)
    vllm_plugin._pil_image_processor_for_qwen2_vl()
    assert sys.modules[TORCHVISION_MODULE] is restored and restored.Qwen2VLImageProcessor is own


def test_with_torchvision_importable_nothing_is_changed_or_required(
        restored: types.ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torchvision_importable(monkeypatch)
    original = inspect.getattr_static(Qwen3OmniMoeProcessor, "from_pretrained")
    vllm_plugin.register()
    assert TORCHVISION_MODULE not in sys.modules and not hasattr(restored, "Qwen2VLImageProcessor")
    assert inspect.getattr_static(Qwen3OmniMoeProcessor, "from_pretrained") is original
    monkeypatch.syspath_prepend(str(stale_metadata(tmp_path)))
    vllm_plugin.require_plugin()  # metadata without the plugin: it is not needed


def stale_metadata(folder: Path) -> Path:
    """What an old editable install leaves in a checkout: omnictl's metadata without the plugin."""
    stale = folder / "omnictl.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: omnictl\nVersion: 0.1.0\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nomnictl = omnictl.cli.main:app\n")
    return folder


def test_a_processor_a_model_registers_by_entry_point_is_what_from_pretrained_returns(
        restored: types.ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The registry is the entry-point group: a distribution that names transformers'
    WhisperProcessor there gets its loader called, with the path alone (vLLM's extra
    arguments dropped); a name transformers does not have is passed over."""
    import transformers

    (tmp_path / "fake_processors.py").write_text("def load(path):\n    return ('loaded', path)\n")
    info = tmp_path / "fakemodel-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakemodel\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{vllm_plugin.PROCESSORS}]\nWhisperProcessor = fake_processors:load\nNoSuchProcessor = fake_processors:load\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(transformers.WhisperProcessor, "from_pretrained",
                        inspect.getattr_static(transformers.WhisperProcessor, "from_pretrained"))
    vllm_plugin._registered_processors_without_video()
    assert transformers.WhisperProcessor.from_pretrained("/a/checkpoint", revision="main") == ("loaded", "/a/checkpoint")
    assert not hasattr(transformers, "NoSuchProcessor")


def test_require_plugin_names_metadata_that_registers_no_processor_for_the_model(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the plugin is not required")
    vllm_plugin.require_plugin("Qwen3OmniMoeProcessor")  # this install's metadata registers it
    folder = stale_metadata(tmp_path)
    (folder / "omnictl.egg-info" / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nomnictl_qwen3_omni = omnictl.schedulers.vllm_plugin:register\n")
    monkeypatch.syspath_prepend(str(folder))
    vllm_plugin.require_plugin()  # the plugin is there: what a model without a processor of its own needs
    with pytest.raises(StartupError) as caught:
        vllm_plugin.require_plugin("Qwen3OmniMoeProcessor")
    assert str(caught.value).startswith(
        f"vLLM will not find omnictl's Qwen3OmniMoeProcessor without video: omnictl's metadata "
        f"({tmp_path / 'omnictl.egg-info'}) registers none in 'omnictl.vllm_processors'")
    hint: Any = caught.value.hint
    assert hint.startswith("reinstall omnictl: pip install -e .")


def test_require_plugin_accepts_this_install_and_names_stale_metadata(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the plugin is not required")
    vllm_plugin.require_plugin()  # this install's metadata names the entry point
    monkeypatch.syspath_prepend(str(stale_metadata(tmp_path)))
    with pytest.raises(StartupError) as caught:
        vllm_plugin.require_plugin()
    message = str(caught.value)
    assert message.startswith(
        f"vLLM will not load omnictl's plugin 'omnictl_qwen3_omni': omnictl's metadata ({tmp_path / 'omnictl.egg-info'}) "
        "predates it, and without it vLLM's Qwen3-Omni thinker needs torchvision")
    hint: Any = caught.value.hint
    assert hint.startswith("reinstall omnictl: pip install -e . (scripts/setup.sh does)")
    assert "stale omnictl.egg-info" in hint
