"""resolve(): importing dotted paths; the `import` rule of `validate --check-imports`."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from omnictl.topology import ResolveError, resolve


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A throwaway package `rfix` on sys.path; returns its name."""
    package = tmp_path / "rfix"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text(textwrap.dedent("""
        VALUE = 3

        def build(**kwargs):
            return ("built", kwargs)

        class Holder:
            @staticmethod
            def make():
                return "made"
        """))
    (package / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (package / "needs.py").write_text("import rfix_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "rfix"
    for name in [n for n in sys.modules if n == "rfix" or n.startswith("rfix.")]:
        del sys.modules[name]


def test_dotted_and_colon_forms(modules: str) -> None:
    assert resolve("rfix.good.build")(x=1) == ("built", {"x": 1})
    assert resolve("rfix.good:build")() == ("built", {})
    assert resolve("rfix.good.Holder.make")() == "made"
    assert resolve("rfix.good:Holder.make")() == "made"


def test_missing_module_names_the_path(modules: str) -> None:
    with pytest.raises(ResolveError, match="'rfix.nope.build'") as caught:
        resolve("rfix.nope.build")
    assert isinstance(caught.value, ImportError)


def test_missing_attribute(modules: str) -> None:
    with pytest.raises(ResolveError, match="'rfix.good' has no attribute 'nothing'"):
        resolve("rfix.good.nothing")


def test_not_callable(modules: str) -> None:
    with pytest.raises(ResolveError, match="int, not a callable"):
        resolve("rfix.good.VALUE")


def test_a_module_that_fails_to_import_reports_why(modules: str) -> None:
    with pytest.raises(ResolveError, match="RuntimeError: boom at import") as caught:
        resolve("rfix.broken.build")
    assert isinstance(caught.value.__cause__, RuntimeError)
    # A missing dependency of the module is not mistaken for the module being absent.
    with pytest.raises(ResolveError, match="rfix_missing_dependency"):
        resolve("rfix.needs.build")


def test_not_a_dotted_path() -> None:
    with pytest.raises(ResolveError, match="dotted path"):
        resolve("build")


IMPORTS = """
stages:
  - name: a
    factory: rfix.good.build
    route_fn: rfix.good.nothing
    next: [b]
    project: {b: rfix.good.VALUE}
  - name: b
    factory: rfix.broken.build
    terminal: true
"""


def test_check_imports_reports_each_bad_path_at_its_line(lint, modules: str) -> None:
    issues = lint(IMPORTS, "import", check_imports=True)
    assert [(i.line, i.stage, i.field) for i in issues] == [
        (4, "a", "route_fn"), (6, "a", "project"), (8, "b", "factory")]
    assert "boom at import" in issues[2].message


def test_imports_are_checked_only_when_asked(lint, modules: str) -> None:
    assert lint(IMPORTS) == []
    text = IMPORTS.replace("rfix.good.nothing", "rfix.good.build").replace(
        "rfix.good.VALUE", "rfix.good.Holder.make").replace("rfix.broken", "rfix.good")
    assert lint(text, check_imports=True) == []
