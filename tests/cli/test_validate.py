"""`omnictl validate`: text and JSON output, exit codes, several files, and staying light."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from omnictl.cli.validate import register, summary
from omnictl.topology import load

REPO = Path(__file__).resolve().parents[2]
ARTICLE = REPO / "topologies" / "qwen3-omni.yaml"
BAD = """\
stages:
  - name: a
    factory: m.a
    next: [b, ghost]
  - name: b
    factory: m.b
"""


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A group, as in omnictl.cli.main, so `validate` is a subcommand."""

    register(app)
    return app


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    return path


def invoke(app: typer.Typer, *args: str):
    return CliRunner().invoke(app, ["validate", *args])


def test_valid_file_prints_what_was_derived(app: typer.Typer) -> None:
    result = invoke(app, str(ARTICLE))
    assert result.exit_code == 0, result.output
    assert f"{ARTICLE}: valid (qwen3-omni: 8 stages, 3 processes)" in result.output
    assert "entry preprocessing" in result.output
    assert "decode (text), code2wav (audio)" in result.output
    assert "thinker -> talker_ar" in result.output and "relay" in result.output


def test_invalid_file_prints_compiler_style_errors_and_exits_1(app: typer.Typer,
                                                               bad_file: Path) -> None:
    result = invoke(app, str(bad_file))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert f"{bad_file}:4:15: unknown-stage: `next` of stage 'a' names 'ghost', which is not a " \
           "stage" in lines
    assert f"{bad_file}:5:5: routing-mode: stage 'b' has no routing mode" in lines
    assert any(line.startswith("  hint: ") for line in lines)
    assert f"{bad_file}: invalid (3 problems)" in lines  # + dead-end: no terminal


def test_json_for_one_file_is_one_object(app: typer.Typer, bad_file: Path) -> None:
    result = invoke(app, "--format", "json", str(bad_file))
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["file"] == str(bad_file) and data["valid"] is False and data["derived"] is None
    ghost = next(e for e in data["errors"] if e["rule"] == "unknown-stage")
    assert (ghost["stage"], ghost["field"], ghost["line"], ghost["column"]) == ("a", "next", 4, 15)
    assert ghost["hint"]


def test_json_for_several_files_is_a_list_with_derived_topologies(app: typer.Typer,
                                                                  bad_file: Path) -> None:
    result = invoke(app, str(ARTICLE), str(bad_file), "--format", "json")
    assert result.exit_code == 1
    good, bad = json.loads(result.stdout)
    assert good["valid"] is True and good["errors"] == []
    assert good["derived"]["entry"] == "preprocessing"
    assert good["derived"]["processes"]["talker"] == {"stages": ["talker_ar", "code2wav"],
                                                      "gpus": [1], "replicas": 1,
                                                      "instances": ["talker"], "node": None, "cpus": 1.0, "elastic": None}
    assert {"from": "thinker", "to": "decode", "kind": "stream",
            "transport": "inproc", "transport_on_cpu": "inproc"} in good["derived"]["edges"]
    assert bad["valid"] is False


def test_unreadable_file_exits_2_and_the_others_are_still_checked(app: typer.Typer,
                                                                  tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = invoke(app, str(missing), str(ARTICLE))
    assert result.exit_code == 2
    assert f"{missing}: error: cannot read topology file" in result.output
    assert f"{ARTICLE}: valid" in result.output
    assert "2 files: 1 valid, 0 invalid, 1 unreadable" in result.output
    result = invoke(app, "--format", "json", str(missing))
    assert result.exit_code == 2
    assert json.loads(result.stdout)["errors"][0]["rule"] == "read"


def test_every_shipped_topology_validates(app: typer.Typer) -> None:
    files = sorted(str(p) for p in (REPO / "topologies").glob("*.yaml"))
    result = invoke(app, *files)
    assert result.exit_code == 0, result.output
    assert f"{len(files)} files: {len(files)} valid, 0 invalid, 0 unreadable" in result.output


def test_check_imports_flag(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "imports.yaml"
    path.write_text("stages:\n  - name: a\n    factory: json.dumps\n    next: [b]\n"
                    "  - name: b\n    factory: json.no_such_function\n    terminal: true\n")
    assert invoke(app, str(path)).exit_code == 0
    result = invoke(app, "--check-imports", str(path))
    assert result.exit_code == 1
    assert f"{path}:6:14: import: stage 'b': `factory` 'json' has no attribute " \
           "'no_such_function'" in result.output


def test_summary_renders_processes_and_edges_in_a_fixed_width_console() -> None:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(summary(load(ARTICLE)))
    text = console.export_text()
    assert "entry preprocessing  terminals decode (text), code2wav (audio)" in text
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert "frontend preprocessing, image_encoder, audio_encoder, mm_aggregate 0 1" in rows
    assert "talker talker_ar, code2wav 1 1" in rows
    # the placement's transport, then what `serve --device cpu` uses instead
    assert "edge kind transport with --device cpu" in rows
    assert "mm_aggregate -> thinker data cuda_ipc shm" in rows
    assert "thinker -> talker_ar data+stream relay shm" in rows
    assert "thinker -> decode data+stream inproc inproc" in rows


def test_a_topology_without_gpus_shows_one_transport_column() -> None:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(summary(load(REPO / "examples" / "three_stages" / "topology.yaml")))
    rows = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert "edge kind transport" in rows and "tokenize -> shout data shm" in rows


def test_the_cli_and_validate_do_not_import_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "import omnictl.cli.main\n"
        "from omnictl.cli.validate import check_files, render_text\n"
        "from rich.console import Console\n"
        "import io\n"
        f"render_text(check_files([__import__('pathlib').Path({str(ARTICLE)!r})], False),"
        " Console(file=io.StringIO()))\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, check=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_root_causes_lead_and_consequences_say_what_they_follow_from(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "typos.yaml"
    path.write_text("stages:\n"
                    "  - {name: prep, factory: m.p, next: [answr]}\n"
                    "  - {name: answer, factory: m.a, nxt: [voice]}\n"
                    "  - {name: voice, factory: m.v, terminal: true}\n")
    result = invoke(app, str(path))
    assert result.exit_code == 1
    problems = [line for line in result.output.splitlines() if line.startswith(str(path) + ":")]
    assert problems[0].split(": ")[1] == "unknown-stage" and problems[1].split(": ")[1] == "schema"
    assert "follows from unknown-stage at 2:" in result.output
    assert re.search(r"; (1 follows|\d+ follow) from the others\)$", problems[-1]), problems[-1]
    data = json.loads(invoke(app, str(path), "--format", "json").output)
    assert [e["follows_from"] is None for e in data["errors"]][:2] == [True, True]
    assert any(e["follows_from"] for e in data["errors"])


def test_a_standard_library_factory_is_valid_but_warned_about(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "sneaky.yaml"
    path.write_text(
        "stages:\n"
        "  - {name: a, factory: os.system, factory_args: {command: 'true'}, next: b}\n"
        "  - {name: b, factory: builtins.eval, terminal: true, modality: text}\n"
    )
    result = invoke(app, str(path))
    assert result.exit_code == 0, result.output
    assert "stage 'a': `factory` is 'os.system', a standard-library callable" in result.output
    assert "stage 'b': `factory` is 'builtins.eval'" in result.output
    assert "standard-library" not in invoke(app, str(ARTICLE)).output


def test_summary_shows_node_labels_and_tcp_edges(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("stages:\n"
                    "  - {name: a, factory: m.a, next: b}\n"
                    "  - {name: b, factory: m.b, terminal: true}\n"
                    "processes:\n  b: {node: gpu-box, cpus: 2}\n")
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(summary(load(path)))
    rows = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert "process stages gpus replicas node cpus" in rows
    assert "b b cpu 1 gpu-box 2" in rows and "a a cpu 1 - 1" in rows
    assert "a -> b data tcp" in rows


def test_one_stage_in_one_process_is_said_in_the_singular(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text("name: one\nstages:\n  - {name: only, factory: m.f, terminal: true, modality: text}\n")
    result = invoke(app, str(path))
    assert result.exit_code == 0, result.output
    assert f"{path}: valid (one: 1 stage, 1 process)" in result.output.splitlines()


def test_one_problem_is_said_in_the_singular(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nstages:\n  - {name: only, factory: m.f, terminal: true, modality: text, nxt: []}\n")
    result = invoke(app, str(path))
    assert result.exit_code == 1
    assert f"{path}: invalid (1 problem)" in result.output.splitlines(), result.output
