"""CLI conventions: --version, -h, completion, and help that describes every option in words."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

import omnictl
from omnictl.cli.main import app

COMMANDS = ("validate", "serve", "bench", "trace", "models")
PYTHON_TYPE = re.compile(r"<(str|int|float|bool|path|list\[\w+\])>", re.IGNORECASE)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.output


def test_version() -> None:
    for flag in ("--version", "-V"):
        code, output = invoke(flag)
        assert code == 0 and output.strip() == f"omnictl {omnictl.__version__}"


@pytest.mark.parametrize("command", [(), *((name,) for name in COMMANDS)])
def test_dash_h_is_help_without_python_type_names(command: tuple[str, ...]) -> None:
    code, output = invoke(*command, "-h")
    assert code == 0, output
    assert "Usage:" in output
    assert not PYTHON_TYPE.search(output), PYTHON_TYPE.search(output)


def test_the_usage_line_writes_arguments_as_manuals_do() -> None:
    # Typer's own: `{FILE}...` for a required argument
    usage = {name: next(line for line in invoke(name, "-h")[1].splitlines() if "Usage:" in line) for name in COMMANDS}
    assert usage["validate"].split() == ["Usage:", "omnictl", "validate", "[OPTIONS]", "FILE..."]
    assert usage["serve"].split()[-1] == "[TOPOLOGY]" and usage["trace"].split()[-1] == "[REQUEST_ID]"
    assert not any("{" in line for line in usage.values()), usage


def test_the_version_has_one_source() -> None:
    # pyproject.toml reads omnictl.__version__ (setuptools' dynamic version): no second copy to drift
    import sys
    from pathlib import Path

    if sys.version_info < (3, 11):
        pytest.skip("tomllib")
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "omnictl.__version__"}


def test_completion_is_offered() -> None:
    code, output = invoke("-h")
    assert "--install-completion" in output and "--show-completion" in output


def test_every_option_and_argument_is_described() -> None:
    group = typer.main.get_command(app)
    for name in COMMANDS:
        command = group.commands[name]
        for param in command.params:
            assert getattr(param, "help", None), f"omnictl {name}: {param.name} has no description"
