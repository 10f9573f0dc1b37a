"""scripts/mutation_summary.py, the helper behind scripts/mutation.sh: the fixed sample
(``MUTATION_SAMPLE``), its interval, and the summary line a run prints."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_summary.py"


@pytest.fixture(scope="module")
def summary() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_summary"] = module
    spec.loader.exec_module(module)
    return module


NAMES = [f"omnictl.serving.x.xǁAǁf__mutmut_{i}" for i in range(20_000)]


def test_the_sample_is_about_the_fraction_asked_and_the_same_every_time(summary: ModuleType) -> None:
    tenth = [n for n in NAMES if summary.in_sample(n, 0.1)]
    assert 1_800 < len(tenth) < 2_200
    assert tenth == [n for n in NAMES if summary.in_sample(n, 0.1)]
    fifth = {n for n in NAMES if summary.in_sample(n, 0.2)}
    assert set(tenth) < fifth  # a smaller sample is part of a bigger one: verdicts carry over
    assert not any(summary.in_sample(n, 0.0) for n in NAMES[:1000])
    assert all(summary.in_sample(n, 1.0) for n in NAMES[:1000])


def test_the_interval_is_wilson_s(summary: ModuleType) -> None:
    low, high = summary.wilson_interval(80, 100)
    assert (round(low, 4), round(high, 4)) == (0.7112, 0.8666)
    assert summary.wilson_interval(0, 0) == (0.0, 1.0)
    low, high = summary.wilson_interval(50, 50)
    assert high == 1.0 and 0.92 < low < 0.93


def test_print_sample_lists_the_sampled_mutants_of_every_module(
    summary: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for module, names in (("a.py.meta", NAMES[:500]), ("sub/b.py.meta", NAMES[500:1000])):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(json.dumps({"exit_code_by_key": {n: None for n in names}}))
    summary.print_sample(0.2, tmp_path)
    printed = capsys.readouterr()
    assert printed.out.split() == [n for n in NAMES[:1000] if summary.in_sample(n, 0.2)]
    assert printed.err.strip() == f"a sample of {len(printed.out.split())} mutants (fraction 0.2)"


def test_the_summary_of_a_sample_counts_only_what_was_judged(summary: ModuleType, tmp_path: Path) -> None:
    results = tmp_path / "serving.results"
    inside = [n for n in NAMES if summary.in_sample(n, 0.1)]
    outside = [n for n in NAMES if not summary.in_sample(n, 0.1)]
    lines = [
        f"    {inside[0]}: killed",
        f"    {inside[1]}: survived",
        f"    {inside[2]}: timeout",
        f"    {inside[3]}: no tests",
        *[f"    {name}: not checked" for name in outside[:4]],
        # verdicts an earlier run with a bigger sample left: not part of this sample's rate
        f"    {outside[4]}: killed",
        f"    {outside[5]}: killed",
    ]
    results.write_text("\n".join(lines) + "\n")
    whole = summary.summarize("serving", results, 12)
    assert whole.startswith("omnictl/serving: 4/10 killed (40.0%) in 12s [")
    sampled = summary.summarize("serving", results, 12, 0.1)
    assert sampled.startswith(
        "omnictl/serving: 2/4 killed (50.0%, 95% interval 15.0-85.0%) in a sample of 4 of its 10 mutants"
    )
    assert "(MUTATION_SAMPLE=0.1) in 12s [not checked 6, killed 1, survived 1, timeout 1, no tests 1]" in sampled
