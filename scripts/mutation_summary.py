"""Helpers of scripts/mutation.sh.

``summary PACKAGE RESULTS SECONDS``: one line from the output of ``mutmut results --all true``.
``survivors``: run in mutmut's working directory, every surviving mutant with its diff
(one process for all of them: ``mutmut show`` per mutant takes seconds each).
``reopen EARLIER MUTANTS``: seed a fresh run's ``mutants/`` folder with an earlier run's
verdicts (the ``.meta`` files under ``EARLIER``), each survivor and "no tests" reset to
unjudged, and print their names: mutmut re-tests those alone (named on its command line)
and keeps the rest, unjudged ones included (``MUTATION_RETEST``); with ``--unjudged`` the
unjudged ones are re-tested too (``MUTATION_RETEST_UNJUDGED=1``)."""

from __future__ import annotations

import json
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


def print_survivors() -> None:
    # mutmut's own modules (3.x): the same calls `mutmut results` and `mutmut show` make.
    from mutmut.__main__ import SourceFileMutationData, status_by_exit_code, walk_mutatable_files
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in data.exit_code_by_key.items():
            if status_by_exit_code[code] == "survived":
                print(f"# {name}: survived")
                print(get_diff_for_mutant(name, path=path))


# mutmut's exit codes of a mutant the tests left alive: survived (0), no tests (5, 33)
_ALIVE = (0, 5, 33)


def reopen(earlier: Path, mutants: Path, unjudged: bool = False) -> None:
    """``unjudged``: the mutants the earlier run never judged (a run cut short) are run too."""
    reopened = kept = 0
    for meta in sorted(earlier.rglob("*.meta")):
        data = json.loads(meta.read_text())
        verdicts = data.get("exit_code_by_key", {})
        for name, code in verdicts.items():
            if code in _ALIVE or (unjudged and code is None):
                verdicts[name] = None
                reopened += 1
                print(name)
            elif code is not None:
                kept += 1
        target = mutants / meta.relative_to(earlier)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=4))
    print(f"earlier verdicts from {earlier}: {kept} kept, {reopened} to re-test", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["survivors"]:
        print_survivors()
    elif sys.argv[1:2] == ["reopen"] and len(sys.argv) in (4, 5) and sys.argv[4:] in ([], ["--unjudged"]):
        reopen(Path(sys.argv[2]), Path(sys.argv[3]), unjudged=sys.argv[4:] == ["--unjudged"])
    elif sys.argv[1:2] == ["summary"] and len(sys.argv) == 5:
        print(summarize(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
    else:
        sys.exit(__doc__)
