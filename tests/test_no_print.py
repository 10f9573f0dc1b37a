"""The library logs through `logging`; only user-facing command output may print."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "omnictl"
# What may print, and why: the CLI's output is for the user; these write a program's own
# stdout as their interface (a `python -m` script's result, the collector's start-up handshake).
ALLOWED = {
    "cli",
    "models/qwen3_omni/tiny.py",  # `python -m ... tiny DIR`: says where it wrote the checkpoint
    "models/qwen3_asr/tiny.py",  # likewise
    "models/voice_assistant/samples.py",  # `python -m ... samples`: lists the files it wrote
    "profiling/collector_process.py",  # "ready" / "error: ..." on stdout: read by the parent at start-up
}


def _prints(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_no_print_in_the_library() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in ALLOWED or relative.split("/", 1)[0] in ALLOWED:
            continue
        found += [f"omnictl/{relative}:{line}" for line in _prints(path)]
    assert not found, "print() in the library (log instead): " + ", ".join(found)
