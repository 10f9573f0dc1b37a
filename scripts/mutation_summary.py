"""Helpers of scripts/mutation.sh.

``summary PACKAGE RESULTS SECONDS``: one line from the output of ``mutmut results --all true``.
``survivors``: run in mutmut's working directory, every surviving mutant with its diff
(one process for all of them: ``mutmut show`` per mutant takes seconds each).
``reopen EARLIER MUTANTS``: seed a fresh run's ``mutants/`` folder with an earlier run's
verdicts (the ``.meta`` files under ``EARLIER``), each survivor and "no tests" reset to
unjudged, and print their names: mutmut re-tests those alone (named on its command line)
and keeps the rest, unjudged ones included (``MUTATION_RETEST``); with ``--unjudged`` the
unjudged ones are re-tested too (``MUTATION_RETEST_UNJUDGED=1``).
``sample FRACTION MUTANTS``: the names of the mutants in a fixed sample of about FRACTION of
them (``MUTATION_SAMPLE``): a mutant is in it by a hash of its name alone, so every run (and
every retest) of the same code draws the same mutants.
``summary PACKAGE RESULTS SECONDS [FRACTION]``: with FRACTION, the rate is the sample's, with
its 95 % interval."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path

# mutmut counts a timeout as a kill: the mutant made a test hang, and the suite noticed.
_KILLED = ("killed", "timeout")


def summarize(package: str, results: Path, seconds: int, fraction: float | None = None) -> str:
    counts: Counter[str] = Counter()
    for line in results.read_text().splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or not name.startswith("omnictl."):
            continue
        if fraction is not None and not in_sample(name, fraction):
            # outside the sample: "not checked", or a verdict kept from an earlier, bigger sample
            counts["not checked"] += 1
            continue
        counts[status] += 1
    detail = ", ".join(f"{status} {n}" for status, n in counts.most_common())
    killed = sum(counts[s] for s in _KILLED)
    if fraction is None:
        total = sum(counts.values())
        rate = 100.0 * killed / total if total else 0.0
        return f"omnictl/{package}: {killed}/{total} killed ({rate:.1f}%) in {seconds}s [{detail}]"
    # A sample: the mutants outside it stay "not checked"; the rate is the sample's.
    everything = sum(counts.values())
    judged = everything - counts["not checked"]
    low, high = wilson_interval(killed, judged)
    return (
        f"omnictl/{package}: {killed}/{judged} killed ({100.0 * killed / max(judged, 1):.1f}%, "
        f"95% interval {100 * low:.1f}-{100 * high:.1f}%) in a sample of {judged} of its {everything} "
        f"mutants (MUTATION_SAMPLE={fraction:g}) in {seconds}s [{detail}]"
    )


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % (Wilson score) interval of a proportion seen in a sample of ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def in_sample(name: str, fraction: float) -> bool:
    """Whether mutant ``name`` is in the sample of ``fraction``: by its name's hash alone."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def print_sample(fraction: float, mutants: Path) -> None:
    names = [
        name
        for meta in sorted(mutants.rglob("*.meta"))
        for name in json.loads(meta.read_text()).get("exit_code_by_key", {})
        if in_sample(name, fraction)
    ]
    for name in names:
        print(name)
    print(f"a sample of {len(names)} mutants (fraction {fraction:g})", file=sys.stderr)


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
    elif sys.argv[1:2] == ["summary"] and len(sys.argv) in (5, 6):
        fraction = float(sys.argv[5]) if len(sys.argv) == 6 else None
        print(summarize(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), fraction))
    elif sys.argv[1:2] == ["sample"] and len(sys.argv) == 4:
        print_sample(float(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
