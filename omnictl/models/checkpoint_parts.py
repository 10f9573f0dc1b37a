"""Load each part of a local checkpoint once per process: what the Qwen families' ``weights.py`` share.

A stage process may hold several stages of one model (the thinker and its frontend, the
talker and its vocoder) that each ask for their part; each part is built once per
checkpoint directory, part name and device, under a lock that one build may take again
(building the talker's side reads the config). Nothing is downloaded: ``model_path`` must be
a checkpoint directory, and a missing or wrong one is a :class:`ModelPathError` naming the
flag, the model and the file it lacks.

CSM's and Higgs Audio's ``model.py`` load one whole model each behind ``functools.lru_cache``
and raise ``ValueError`` for no path; they are left as they are (a change of error type).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from omnictl.exceptions import ModelPathError


def checkpoint_dir(
    model_path: str | Path | None,
    *,
    model: str,
    flag: str,
    writer: str,
    required: Iterable[str] = ("config.json",),
) -> Path:
    """``model_path`` as a Path, or a :class:`ModelPathError` when it is missing or lacks a file of
    ``required``. ``model``: the model's name in the message; ``flag``: the command-line option that
    gives the path; ``writer``: the module that writes a tiny checkpoint (``python -m writer DIR``)."""
    if model_path is None:
        raise ModelPathError(
            f"{model} stages need a local checkpoint directory (nothing is downloaded)",
            hint=f"pass {flag} DIR, or model_path= to Pipeline.launch",
        )
    path = Path(model_path).expanduser()
    for name in required:
        if not (path / name).is_file():
            raise ModelPathError(
                f"{flag} {str(path)!r} is not a {model} checkpoint directory (no {name})",
                hint=f"write a tiny one with `python -m {writer} DIR`",
            )
    return path


class CheckpointParts:
    """One process's parts of one family's checkpoints, each built once."""

    def __init__(self, check: Callable[[str | Path | None], Path]) -> None:
        self._check = check  # the family's checkpoint_dir: every load is checked first
        self._cache: dict[tuple[str, str, str], Any] = {}
        self._lock = threading.RLock()  # building one part may load another (the config)

    def once(
        self, model_path: str | Path | None, part: str, device: str | None, build: Callable[[Path, str], Any]
    ) -> Any:
        """``build(path, device)``'s result for this checkpoint, part and device (``cpu`` when None),
        built on the first call only."""
        path = self._check(model_path)
        key = (str(path.resolve()), part, device or "cpu")
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build(path, key[2])
            return self._cache[key]
