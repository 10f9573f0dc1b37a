"""Words the commands print: counts with the noun in its number ("1 stage", "2 processes")."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``-es`` after s, x, ch, sh: "2 processes")."""
    if n == 1:
        return f"{n} {noun}"
    plural = noun + "es" if noun.endswith(("s", "x", "ch", "sh")) else noun + "s"
    return f"{n} {plural}"
