"""Import the callables a topology names (factories, route/merge functions, projections)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from omnictl.topology.raw import DOTTED_FIELDS, RawStage, Reporter


class ResolveError(ImportError):
    """A dotted path in a topology cannot be imported, or names something not callable."""

    def __init__(self, dotted: str, reason: str) -> None:
        self.dotted = dotted
        self.reason = reason
        super().__init__(f"cannot use {dotted!r}: {reason}")


def _split(dotted: str) -> list[tuple[str, list[str]]]:
    """Candidate (module, attribute chain) splits, longest module first."""
    if ":" in dotted:
        module, _, attrs = dotted.partition(":")
        return [(module, attrs.split("."))]
    parts = dotted.split(".")
    return [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]


def _is_missing(error: ModuleNotFoundError, module: str) -> bool:
    """True when ``module`` itself (or a parent package) is absent, not something it imports."""
    return error.name is not None and (module == error.name or module.startswith(error.name + "."))


def resolve(dotted: str) -> Callable[..., Any]:
    """Import ``package.module.attr`` (or ``package.module:attr``) and return the callable."""
    if not isinstance(dotted, str) or not dotted.strip(". :") or (
            ":" not in dotted and "." not in dotted):
        raise ResolveError(str(dotted), "expected a dotted path like package.module.function")
    for module_name, attrs in _split(dotted):
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if _is_missing(error, module_name):
                continue  # maybe a shorter prefix is the module and the rest attributes
            raise ResolveError(dotted, f"importing {module_name!r} failed: {error}") from error
        except Exception as error:  # the module itself raised while importing: report why
            raise ResolveError(
                dotted, f"importing {module_name!r} failed: {type(error).__name__}: {error}"
            ) from error
        for depth, attr in enumerate(attrs):
            try:
                target = getattr(target, attr)
            except AttributeError as error:
                owner = ".".join([module_name, *attrs[:depth]])
                raise ResolveError(dotted, f"{owner!r} has no attribute {attr!r}") from error
        if not callable(target):
            raise ResolveError(dotted, f"it is a {type(target).__name__}, not a callable")
        return target  # type: ignore[no-any-return]
    raise ResolveError(dotted, "no module of that name can be imported")


def check_imports(stage: RawStage, report: Reporter) -> None:
    """``import``: every dotted path the stage names resolves to a callable."""
    named: list[tuple[str, tuple[str, ...], str | None]] = [
        (key, (key,), getattr(stage, key)) for key in DOTTED_FIELDS]
    named += [("project", ("project", target), path) for target, path in stage.project.items()]
    for key, at, dotted in named:
        if dotted is None:
            continue
        try:
            resolve(dotted)
        except ResolveError as error:
            report.add("import", f"stage {stage.name!r}: `{key}` {error.reason} "
                       f"({dotted})", stage=stage, field=key, at=at,
                       hint="check the dotted path, and that its package is installed")
