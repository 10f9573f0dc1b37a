"""One problem found in a topology file, with where it is and how to fix it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Issue:
    rule: str  # stable id, e.g. "cycle", "unknown-stage" (see README's rule table)
    message: str
    file: str
    line: int  # 1-based; points into the stage (or field) at fault
    column: int  # 1-based
    stage: str | None = None
    field: str | None = None
    hint: str | None = None
    # "<rule> at <line>:<col>" of the root cause this problem only follows from
    follows_from: str | None = None

    def format(self) -> str:
        """Compiler-style text: ``file:line:col: rule: message`` then the hint."""
        text = f"{self.file}:{self.line}:{self.column}: {self.rule}: {self.message}"
        if self.follows_from:
            text += f"\n  follows from {self.follows_from}: fixing that fixes this"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["file"]
        return data
