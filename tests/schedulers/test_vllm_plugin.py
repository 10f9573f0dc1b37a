"""omnictl's vLLM plugin, in fresh interpreters (it patches modules process-wide): where
torchvision is absent, vLLM's Qwen3-Omni imports load and the processor has no video part;
metadata that predates the plugin is one clear error naming it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install -e '.[vllm]'; scripts/setup.sh installs it)")
if importlib.util.find_spec("torchvision") is not None:
    pytest.skip("torchvision is installed: the plugin changes nothing", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]


def python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_vllm_loads_the_plugin_and_its_qwen3_omni_imports_then_work(tmp_path: Path) -> None:
    from omnictl.models.qwen3_omni.tiny import _build_processor, _build_tokenizer, _save_processor

    # The tiny checkpoint's processor files alone (its tokenizer and preprocessor_config.json,
    # as write_tiny_checkpoint saves them): the processor is what vLLM's imports load here.
    tiny_qwen = tmp_path / "tiny"
    _save_processor(_build_processor(_build_tokenizer()), tiny_qwen)
    before = python("from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize")
    assert "torchvision" in before.stderr  # what vllm/model_executor/models/qwen2_vl.py does, failing without it
    after = python(
        "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        "from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize\n"
        "from transformers import Qwen3OmniMoeProcessor\n"
        f"p = Qwen3OmniMoeProcessor.from_pretrained({str(tiny_qwen)!r}, trust_remote_code=False)\n"
        "print(type(p).__name__, p.video_processor, type(p.image_processor).__name__)\n"
    )
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout.split() == ["Qwen3OmniProcessorWithoutVideo", "None", "Qwen2VLImageProcessorPil"]


def test_metadata_that_predates_the_plugin_is_named(tmp_path: Path) -> None:
    stale = tmp_path / "omnictl.egg-info"  # what an old editable install leaves in a checkout
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: omnictl\nVersion: 0.1.0\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nomnictl = omnictl.cli.main:app\n")
    out = python("from omnictl.schedulers.vllm_plugin import require_plugin\nrequire_plugin()", cwd=tmp_path)
    assert out.returncode != 0
    assert "plugin 'omnictl_qwen3_omni'" in out.stderr and "omnictl.egg-info" in out.stderr, out.stderr[-2000:]
    assert python("from omnictl.schedulers.vllm_plugin import require_plugin\nrequire_plugin()").returncode == 0
