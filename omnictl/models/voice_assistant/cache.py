"""Where converted and reassembled weights live, and a lock so two processes build them once."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import platformdirs

CACHE_ENV = "OMNICTL_CACHE_DIR"


def cache_dir() -> Path:
    """``$OMNICTL_CACHE_DIR`` if set, else the user's cache directory for omnictl."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path(platformdirs.user_cache_dir("omnictl"))


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock next to ``target`` while it is being built.

    Stage processes start together; without the lock each would convert the same
    model at once and race on the rename.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def package_data_dir(package: str, subdir: str = "") -> Path:
    """The installed folder of ``package`` (found without importing it), plus ``subdir``."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the voice assistant needs the PyPI package {package.replace('_', '-')!r}; "
            "install the demo extra: pip install 'omnictl[demo]'"
        )
    return Path(list(spec.submodule_search_locations)[0]) / subdir
