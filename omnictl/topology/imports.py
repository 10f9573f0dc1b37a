"""The one import rule for the user code a topology names (factories, ``route_fn``,
``merge_fn``, projections).

A dotted path is imported with the topology file's directory first on the import path,
then ``sys.path`` — the same rule wherever it is resolved: ``omnictl validate
--check-imports`` (here, in :func:`check_imports`), and ``serve``, ``bench`` and
``Pipeline.launch``, whose stage processes get the directory first on their ``sys.path``
from the launcher (:func:`worker_sys_path`). A topology next to its ``stages.py`` thus
names ``stages.tokenize`` wherever it is run from, as ``python run.py`` beside it would.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from omnictl.exceptions import ResolveError
from omnictl.topology.raw import DOTTED_FIELDS, RawStage, Reporter

__all__ = [
    "ResolveError",
    "check_imports",
    "find_callable",
    "forget_modules_from",
    "import_path",
    "resolve",
    "resolve_callable",
    "topology_dir",
    "worker_sys_path",
]


def topology_dir(path: str | Path | None) -> Path | None:
    """The absolute directory of a topology file (None for a topology read from a string)."""
    if path is None or str(path).startswith("<"):
        return None
    return Path(path).resolve().parent


def worker_sys_path(directory: Path | None, base: Sequence[str]) -> tuple[str, ...]:
    """``base`` (the parent's ``sys.path``) with the topology's ``directory`` first: what a
    stage process imports user code with."""
    first = [str(directory)] if directory is not None else []
    return tuple(dict.fromkeys([*first, *base]))


def _found_in(name: str, module: Any, directory: Path) -> bool:
    """True when ``directory`` is the import-path entry that module ``name`` came from (its
    file is ``directory/<name as a path>``): not omnictl itself, nor a package that merely
    lives below it (a virtualenv inside the project)."""
    file = getattr(module, "__file__", None)
    if file is None or name == "omnictl" or name.startswith("omnictl."):
        return False
    try:
        parts = list(Path(file).resolve().relative_to(directory).parts)
    except ValueError:
        return False
    stem = parts.pop().split(".")[0]  # stages.py, stages.cpython-311-x86_64-linux-gnu.so
    if stem != "__init__":
        parts.append(stem)
    return parts == name.split(".")


@contextlib.contextmanager
def import_path(directory: Path | None) -> Iterator[None]:
    """Import with ``directory`` first on ``sys.path``, for one check; undone on exit.

    Modules imported from ``directory`` meanwhile are forgotten again on exit, so checking a
    second topology whose own ``stages.py`` shares the name does not get the first one's.
    Nothing changes when ``directory`` is on ``sys.path`` already (as in a stage process).
    """
    if directory is None:
        yield
        return
    entry = str(directory)
    added = entry not in sys.path
    before = set(sys.modules)
    if added:
        sys.path.insert(0, entry)
    importlib.invalidate_caches()  # files written since the last import must be seen
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):  # user code may have removed it itself
                sys.path.remove(entry)
            forget_modules_from(directory, among=set(sys.modules) - before)


def forget_modules_from(directory: Path, among: set[str] | None = None) -> None:
    """Drop the modules imported from ``directory`` (of ``among``; None: of all imported) from
    ``sys.modules``, so that the next import of the same name finds the file it names then."""
    for name in set(sys.modules) if among is None else among:
        module = sys.modules.get(name)
        if module is not None and _found_in(name, module, directory):
            del sys.modules[name]


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


def resolve_callable(dotted: str, directory: Path | None = None, *, where: str | None = None) -> Callable[..., Any]:
    """Import ``package.module.attr`` (or ``package.module:attr``) and return the callable.

    ``directory`` (a topology's directory) is searched before ``sys.path``; ``where`` (the
    topology file:line and field) goes into the error. Raises :class:`ResolveError` saying
    which module, from where and why: the module that is missing, the attribute that is
    not there, or what the module raised while importing.
    """
    searched = (str(directory),) if directory is not None else ()

    def fail(reason: str) -> ResolveError:
        return ResolveError(str(dotted), reason, where=where, searched=searched)

    if not isinstance(dotted, str) or not dotted.strip(". :") or (":" not in dotted and "." not in dotted):
        raise fail("expected a dotted path like package.module.function")
    missing: ModuleNotFoundError | None = None  # why the longest candidate module is absent
    with import_path(directory):  # a no-op when the directory is on sys.path already
        for module_name, attrs in _split(dotted):
            try:
                target: Any = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if _is_missing(error, module_name):
                    missing = missing or error
                    continue  # maybe a shorter prefix is the module and the rest attributes
                raise fail(f"importing module {module_name!r} failed: {error}") from error
            except Exception as error:  # the module itself raised while importing: say what
                raise fail(f"importing module {module_name!r} failed: {type(error).__name__}: {error}") from error
            for depth, attr in enumerate(attrs):
                try:
                    target = getattr(target, attr)
                except AttributeError as error:
                    owner = ".".join([module_name, *attrs[:depth]])
                    if depth == 0 and missing is not None:  # neither a module nor an attribute
                        raise fail(
                            f"no module named {missing.name!r} (and module {owner!r} has no attribute {attr!r})"
                        ) from missing
                    raise fail(f"{owner!r} has no attribute {attr!r}") from error
            if not callable(target):
                raise fail(f"it is a {type(target).__name__}, not a callable")
            return target
    assert missing is not None  # every candidate was a missing module
    raise fail(f"no module named {missing.name!r}") from missing


def _top_level_names(source: str) -> set[str] | None:
    """The names a module's source binds at top level; None when it may bind others
    dynamically (a module ``__getattr__``, a star import) or cannot be parsed."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == "__getattr__":
                    return False
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if not all(visit(block) for block in blocks):
                    return False
        return True

    return names if visit(tree.body) else None


def find_callable(dotted: str, directory: Path | None = None, *, where: str | None = None) -> None:
    """Raise :class:`ResolveError` when ``dotted`` certainly names nothing, without importing
    it: no module of that name can be found, or the module's source binds no such top-level
    name. Quiet when it cannot tell (a compiled module, a module ``__getattr__``); the stage
    process's import then has the last word. Only parent packages are imported, so a
    launch can check every factory before it starts any process (and loads any model)."""
    searched = (str(directory),) if directory is not None else ()
    if not isinstance(dotted, str) or (":" not in dotted and "." not in dotted):
        raise ResolveError(
            str(dotted), "expected a dotted path like package.module.function", where=where, searched=searched
        )
    missing = None
    with import_path(directory):
        for module_name, attrs in _split(dotted):
            try:
                spec = importlib.util.find_spec(module_name)
            except ModuleNotFoundError as error:
                missing = missing or error.name
                continue
            except Exception:  # a parent package raised while importing: the stage process will say
                return
            if spec is None:
                missing = missing or module_name
                continue
            origin = spec.origin
            if origin is None or not origin.endswith(".py"):
                return
            try:
                names = _top_level_names(Path(origin).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                return
            if names is None or attrs[0] in names:
                return
            close = difflib.get_close_matches(attrs[0], sorted(names), n=1)
            guess = f" (did you mean {module_name}.{close[0]}?)" if close else ""
            raise ResolveError(
                dotted,
                f"module {module_name!r} ({origin}) defines no {attrs[0]!r}{guess}",
                where=where,
                searched=searched,
            )
    raise ResolveError(dotted, f"no module named {missing!r}", where=where, searched=searched)


# The stage builder resolves through the same function; the stage process already has the
# topology directory first on sys.path (see worker_sys_path).
resolve = resolve_callable


def check_imports(stage: RawStage, report: Reporter, directory: Path | None = None, *, static: bool = False) -> None:
    """``import``: every dotted path the stage names resolves to a callable.

    The caller wraps the whole file in :func:`import_path` so each module is imported once.
    ``static``: only what :func:`find_callable` can tell without importing the modules.
    """
    named: list[tuple[str, tuple[str, ...], str | None]] = [(key, (key,), getattr(stage, key)) for key in DOTTED_FIELDS]
    named += [("project", ("project", target), path) for target, path in stage.project.items()]
    for key, at, dotted in named:
        if dotted is None:
            continue
        try:
            if static:
                find_callable(dotted, directory)
            else:
                resolve_callable(dotted, directory)
        except ResolveError as error:
            searched = f"; searched {directory}, then sys.path" if directory else ""
            report.add(
                "import",
                f"stage {stage.name!r}: `{key}` {error.reason} ({dotted}{searched})",
                stage=stage,
                field=key,
                at=at,
                hint="check the dotted path, and that its module is in the topology's "
                "directory or an installed package",
            )
