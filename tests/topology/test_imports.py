"""One import rule for user code: the topology file's directory first, then sys.path — in
`validate --check-imports` and in the stage processes `Pipeline.launch` (serve, bench)
spawns. A failure says which module, from where, and why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omnictl
from omnictl.exceptions import ResolveError
from omnictl.topology import validate
from omnictl.topology.imports import import_path, resolve_callable, worker_sys_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "three_stages"

TOPOLOGY = """\
stages:
  - name: a
    factory: {factory}
    terminal: true
"""


def _cli() -> list[str]:
    """`omnictl` as a user runs it: the console script, whose sys.path has no cwd."""
    script = Path(sys.executable).with_name("omnictl")
    if script.exists():
        return [str(script)]
    if sys.version_info < (3, 11):  # pragma: no cover
        pytest.skip("needs the omnictl console script or python -P")
    return [sys.executable, "-P", "-m", "omnictl.cli.main"]


@pytest.mark.parametrize("cwd, file", [
    (REPO, "examples/three_stages/topology.yaml"),
    (EXAMPLE, "topology.yaml"),
], ids=["from-the-repo-root", "from-its-folder"])
def test_validate_check_imports_accepts_the_three_stage_example(cwd: Path, file: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # omnictl itself, not the example's folder
    result = subprocess.run([*_cli(), "validate", "--check-imports", file], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{file}: valid" in result.stdout


def _project(tmp_path: Path, source: str, factory: str, name: str = "proj") -> Path:
    project = tmp_path / name
    project.mkdir()
    (project / "userstages.py").write_text(textwrap.dedent(source))
    path = project / "topology.yaml"
    path.write_text(TOPOLOGY.format(factory=factory))
    return path


def test_a_missing_module_names_it_the_line_and_the_directory_searched(tmp_path: Path) -> None:
    path = _project(tmp_path, "def make():\n    return lambda d: d\n", "nosuchmodule_xyz.make")
    issues = validate(path, check_imports=True).issues
    assert [(i.rule, i.line, i.field) for i in issues] == [("import", 3, "factory")]
    message = issues[0].message
    assert "no module named 'nosuchmodule_xyz'" in message
    assert str(path.parent) in message
    assert "nosuchmodule_xyz.make" in message


def test_a_missing_attribute_names_the_module_and_the_attribute(tmp_path: Path) -> None:
    path = _project(tmp_path, "def make():\n    return lambda d: d\n", "userstages.nothing")
    issues = validate(path, check_imports=True).issues
    assert len(issues) == 1
    assert "'userstages' has no attribute 'nothing'" in issues[0].message
    assert str(path.parent) in issues[0].message


def test_a_module_that_raises_while_importing_says_what_it_raised(tmp_path: Path) -> None:
    path = _project(tmp_path, "import json\nraise ValueError('no config here')\n",
                    "userstages.make")
    issues = validate(path, check_imports=True).issues
    assert "importing module 'userstages' failed: ValueError: no config here" in issues[0].message


def test_the_resolver_error_carries_where_and_why(tmp_path: Path) -> None:
    with pytest.raises(ResolveError) as caught:
        resolve_callable("nosuchmodule_xyz.make", tmp_path, where="t.yaml:3 `factory` of 'a'")
    error = caught.value
    assert isinstance(error, ImportError)
    assert str(error) == (f"cannot use 'nosuchmodule_xyz.make' (t.yaml:3 `factory` of 'a'): no "
                          f"module named 'nosuchmodule_xyz' [searched {tmp_path}, then sys.path]")
    assert isinstance(error.__cause__, ModuleNotFoundError)


def test_a_missing_submodule_is_named_rather_than_a_missing_attribute(tmp_path: Path) -> None:
    package = tmp_path / "userpkg_q"
    package.mkdir()
    (package / "__init__.py").write_text("")
    with pytest.raises(ResolveError, match=r"no module named 'userpkg_q.nope' \(and module "
                       r"'userpkg_q' has no attribute 'nope'\)"):
        resolve_callable("userpkg_q.nope.make", tmp_path)


def test_two_topologies_with_a_same_named_module_each_get_their_own(tmp_path: Path) -> None:
    first = _project(tmp_path, "def one():\n    return lambda d: d\n", "userstages.one", "first")
    second = _project(tmp_path, "def two():\n    return lambda d: d\n", "userstages.two", "second")
    assert validate(first, check_imports=True).valid
    assert validate(second, check_imports=True).valid  # not the first folder's userstages
    assert "userstages" not in sys.modules and str(first.parent) not in sys.path


def test_import_path_is_a_no_op_for_a_directory_already_on_sys_path(tmp_path: Path,
                                                                    monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(sys.path)
    with import_path(tmp_path):
        assert sys.path == before
    assert sys.path == before


def test_stage_processes_get_the_topology_directory_first(tmp_path: Path) -> None:
    assert worker_sys_path(tmp_path, ["/a", str(tmp_path), "/b"]) == (str(tmp_path), "/a", "/b")
    assert worker_sys_path(None, ["/a"]) == ("/a",)


def test_a_launched_pipeline_imports_user_code_beside_its_topology(tmp_path: Path) -> None:
    # Launched from the repository root: only the topology's folder has `userstages`.
    source = "def make():\n    return lambda data: {'seen': data['x'] * 2}\n"
    path = _project(tmp_path, source, "userstages.make")
    assert omnictl.run(path, {"x": 21}, profile=False) == {"a": {"seen": 42}}


def test_a_launch_whose_factory_is_missing_says_which_module_from_where_and_why(tmp_path: Path) -> None:
    # Found missing before any process starts (the module's source defines no `make`) ...
    path = _project(tmp_path, "", "userstages.make")
    with pytest.raises(omnictl.TopologyError) as caught:
        omnictl.run(path, {"x": 1}, profile=False)
    message = str(caught.value)
    assert f"{path}:3:" in message and "stage 'a': `factory`" in message and "defines no 'make'" in message
    assert str(tmp_path) in message
    # ... and, where only importing can tell (a module __getattr__), by the stage process
    path = _project(tmp_path, "def __getattr__(name):\n    raise AttributeError(name)\n", "userstages.make", "dynamic")
    for _ in range(3):  # the stage process exits at once: its report must still arrive first
        with pytest.raises(omnictl.LaunchError) as info:
            omnictl.run(path, {"x": 1}, profile=False)
        message = str(info.value)
        assert "stage 'a' failed to start" in message and "'userstages' has no attribute 'make'" in message
        assert f"{path}:" in message and "`factory` of stage 'a'" in message and str(tmp_path) in message
        assert "its factory raised" not in message and "exit code" not in message


# ---- find_callable: what a launch checks before it starts any process (imports nothing)


def _misspelt_project(tmp_path: Path, source: str) -> Path:
    (tmp_path / "mystages.py").write_text(source)
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nstages:\n  - name: a\n    factory: mystages.make_a\n    next: [b]\n"
                    "  - name: b\n    process: other\n    factory: mystages.mak_b\n    terminal: true\n")
    return path


def test_a_misspelt_factory_fails_the_launch_at_its_line_before_any_process(tmp_path: Path) -> None:
    import omnictl
    from omnictl.exceptions import TopologyError

    path = _misspelt_project(tmp_path, "raise SystemExit('imported: a launch must not import user code to check it')\n"
                    "def make_a():\n    return lambda d: d\n\ndef make_b():\n    return lambda d: d\n")
    with pytest.raises(TopologyError) as caught:
        omnictl.Pipeline.launch(path)  # raises before anything is spawned (no await needed)
    (issue,) = caught.value.issues
    assert (issue.rule, issue.stage, issue.field, issue.line) == ("import", "b", "factory", 8)
    assert "defines no 'mak_b'" in issue.message and "did you mean mystages.make_b" in issue.message


def test_find_callable_is_quiet_when_it_cannot_tell(tmp_path: Path) -> None:
    from omnictl.topology.imports import find_callable

    (tmp_path / "dyn.py").write_text("def __getattr__(name):\n    return lambda: name\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    (tmp_path / "cond.py").write_text("try:\n    import json as fast\nexcept ImportError:\n    fast = None\n"
                                      "if True:\n    def inner():\n        pass\n")
    for dotted in ("dyn.anything", "star.join", "cond.fast", "cond.inner", "os.path.join", "omnictl.run"):
        find_callable(dotted, tmp_path)
    with pytest.raises(ResolveError, match="no module named 'nosuchmodule'"):
        find_callable("nosuchmodule.f", tmp_path)
    with pytest.raises(ResolveError, match="defines no 'missing'"):
        find_callable("cond.missing", tmp_path)
