"""One summary line from `mutmut results --all true` output (used by scripts/mutation.sh)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# mutmut counts a timeout as a kill: the mutant made a test hang, and the suite noticed.
_KILLED = ("killed", "timeout")


def summarize(package: str, results: Path, seconds: int) -> str:
    counts: Counter[str] = Counter()
    for line in results.read_text().splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("omnictl."):
            counts[status] += 1
    total = sum(counts.values())
    killed = sum(counts[s] for s in _KILLED)
    rate = 100.0 * killed / total if total else 0.0
    detail = ", ".join(f"{status} {n}" for status, n in counts.most_common())
    return f"omnictl/{package}: {killed}/{total} killed ({rate:.1f}%) in {seconds}s [{detail}]"


if __name__ == "__main__":
    print(summarize(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
