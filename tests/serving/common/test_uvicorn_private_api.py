"""The connection guard subclasses uvicorn's private protocol classes (there is no public hook
for what it does: omnictl/serving/common/connections.py says why), so pyproject.toml pins
uvicorn to the versions it was checked on. These fail loudly, naming what moved, when the
installed uvicorn is outside that range or lacks what the guard uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version

from omnictl.serving.common import connections

tomllib = pytest.importorskip("tomllib")
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def pinned() -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    return next(Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn")


def test_uvicorn_is_pinned_to_a_range_with_an_upper_bound_and_the_installed_one_is_in_it() -> None:
    requirement = pinned()
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier), (
        f"pyproject.toml: {requirement} has no upper bound, but connections.py subclasses uvicorn's private classes"
    )
    assert Version(uvicorn.__version__) in requirement.specifier, (
        f"uvicorn {uvicorn.__version__} is installed, outside pyproject.toml's {requirement}"
    )


def test_uvicorn_still_has_what_the_connection_guard_uses() -> None:
    missing = connections.uvicorn_api_missing()
    assert not missing, (
        f"uvicorn {uvicorn.__version__} changed what omnictl/serving/common/connections.py subclasses "
        "(check the guard against it before widening pyproject.toml's range):\n" + "\n".join(missing)
    )


def test_the_check_names_a_method_gone_one_that_changed_and_an_attribute_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Protocol:
        def __init__(self) -> None:
            self.kept = 1

        def connection_lost(self, exc: Exception | None, extra: int = 0) -> None:
            pass

    wanted = {"connection_lost": ("self", "exc"), "on_response_complete": ("self",)}
    monkeypatch.setattr(connections, "UVICORN_PRIVATE_API", {Protocol: (wanted, ("kept", "cycle"))})
    where = f"{Protocol.__module__}.{Protocol.__qualname__}"
    assert connections.uvicorn_api_missing() == [
        f"{where}.connection_lost: takes (self, exc, extra), not (self, exc)",
        f"{where}.on_response_complete: no such method",
        f"{where}: no self.cycle",
    ]
