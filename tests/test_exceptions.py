"""One exceptions tree: every exception class omnictl defines derives from OmnictlError and
is reachable from ``omnictl.exceptions``, so callers import errors from one place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import omnictl
import omnictl.exceptions
from omnictl.exceptions import OmnictlError


def _modules() -> tuple[list[ModuleType], list[str]]:
    """Every omnictl module, and those skipped because an optional package is missing."""
    modules: list[ModuleType] = []
    skipped: list[str] = []
    for info in pkgutil.walk_packages(omnictl.__path__, "omnictl."):
        try:
            modules.append(importlib.import_module(info.name))
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] == "omnictl":
                raise  # a broken import inside omnictl, not a missing optional package
            skipped.append(f"{info.name} (needs {error.name})")
    return modules, skipped


def _exception_classes() -> list[type[BaseException]]:
    modules, skipped = _modules()
    if skipped:
        print("not checked, an optional package is missing:", ", ".join(skipped))
    found: dict[str, type[BaseException]] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


CLASSES = _exception_classes()


def test_the_walk_finds_the_tree() -> None:
    assert OmnictlError in CLASSES and len(CLASSES) > 5


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_class_is_an_omnictl_error_importable_from_omnictl_exceptions(
        cls: type[BaseException]) -> None:
    where = f"{cls.__module__}.{cls.__qualname__}"
    assert issubclass(cls, OmnictlError), f"{where} does not derive from OmnictlError"
    assert getattr(omnictl.exceptions, cls.__name__, None) is cls, (
        f"{where} is not importable from omnictl.exceptions: define it there")


def test_the_module_docstring_draws_every_class() -> None:
    doc = omnictl.exceptions.__doc__ or ""
    for name, cls in vars(omnictl.exceptions).items():
        if inspect.isclass(cls) and issubclass(cls, OmnictlError):
            assert re.search(rf"^\s*[│├└─ ]*{name}\b", doc, re.M), f"{name} missing from the tree"


def test_errors_that_were_other_kinds_keep_those_bases() -> None:
    # Code that guards an import with `except ImportError` still catches a bad dotted path.
    assert issubclass(omnictl.exceptions.ResolveError, ImportError)
    assert issubclass(omnictl.exceptions.PayloadTooLarge, omnictl.exceptions.InvalidRequest)
