"""benchmarks/gpu_session.sh, the GPU device session's one command, run here as its CPU dry run
(tiny sizes, --device cpu, the same steps and the same output files), so that it cannot rot
between the sessions that have a GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_session.sh"
FILES = {"summary.txt", "steps.log", "results.json", "nvidia-smi.txt", "gpu-memory.csv", "logs.tar.gz"}
STEPS = ["gpu_tests", "cuda_ipc", "checkpoint", "open_loop", "continuity"]
GOALS = ("first audio at one request", "staged sustains >= 2x", "deadline sustains >= 1.5x", "cuda_ipc moves a 64 MiB")
VERDICT = re.compile(r"^goal: (?P<text>.+) -> (?P<verdict>met|NOT met|not measured)(?P<note>.*)$", re.M)


def session(out: Path, *args: str, limit_s: int | None = None, timeout: float = 660) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    if limit_s is not None:
        env["GPU_SESSION_LIMIT_S"] = str(limit_s)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gpu-session")
    done = session(out, "--dry-run")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.timeout(720)
def test_dry_run_writes_the_files_the_device_tool_brings_back(dry_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = dry_run
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == FILES
    # what the device tool returns: at most 8 files, 16 MiB each, plain names
    for name in written:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name)
        assert 0 < (out / name).stat().st_size <= 16 << 20, name


@pytest.mark.timeout(720)
def test_dry_run_runs_every_step_to_the_end(dry_run: tuple[Path, dict[str, Any]]) -> None:
    out, results = dry_run
    steps = {s["step"]: s for s in results["steps"]}
    assert list(steps) == STEPS
    log = (out / "steps.log").read_text()
    assert all(s["outcome"] == "ok" for s in steps.values()), (steps, log[-6000:])
    assert "3 skipped" in log and "needs a CUDA GPU" in log  # the GPU tests were collected, and skipped on the CPU
    assert results["dry_run"] is True and results["seconds"] <= results["limit_s"]


@pytest.mark.timeout(720)
def test_dry_run_prints_each_goal_with_a_verdict(dry_run: tuple[Path, dict[str, Any]]) -> None:
    out, results = dry_run
    summary = (out / "summary.txt").read_text()
    lines = list(VERDICT.finditer(summary))
    assert [g for g in GOALS if not any(m["text"].startswith(g) for m in lines)] == []
    assert len(lines) == len(GOALS)
    # every goal measured (a step that broke would read "not measured"), each marked as the dry run
    assert all(m["verdict"] in ("met", "NOT met") for m in lines), summary
    assert all("dry run" in m["note"] for m in lines)
    assert [g["met"] for g in results["goals"]] == [m["verdict"] == "met" for m in lines]


@pytest.mark.timeout(720)
def test_dry_run_results_hold_every_steps_figures(dry_run: tuple[Path, dict[str, Any]]) -> None:
    out, results = dry_run
    ipc = results["cuda_ipc"]
    assert ipc["transport"] == "shm" and ipc["gb_per_s"] > 0
    loop = results["open_loop"]
    assert loop["size"] == "tiny" and loop["device"] == "cpu"
    one = loop["staged_one"]
    assert 0 < one["first_text_s"] <= one["total_s"] and 0 < one["first_audio_s"] <= one["total_s"]
    assert {side for sides in loop["rates"].values() for side in sides} == {"staged", "monolithic"}
    assert set(loop["sustained_per_s"]) == {"staged", "monolithic", "highest_offered"}
    qwen = results["continuity"]["topologies"]["qwen"]
    assert set(qwen["rates"]) == {"fifo", "deadline"}
    assert all(f["played"] == f["requests"] for by_rate in qwen["rates"].values() for f in by_rate.values())
    # memory per process, each stage process named by the pids the benchmarks recorded
    named = " ".join(results["peak_memory_mib_per_process"])
    for stage_process in ("open_loop thinker", "open_loop talker", "continuity fifo thinker",
                          "continuity deadline talker"):
        assert stage_process in named
    assert "nvidia-smi: not found" in (out / "nvidia-smi.txt").read_text()


def test_a_session_out_of_time_skips_the_steps_and_still_reports(tmp_path: Path) -> None:
    # the whole limit under the 20 s kept for the summary: every step is skipped, none hangs
    done = session(tmp_path, "--dry-run", limit_s=15, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(s["step"], s["outcome"]) for s in results["steps"]] == [(step, "skipped") for step in STEPS]
    summary = (tmp_path / "summary.txt").read_text()
    assert [m["verdict"] for m in VERDICT.finditer(summary)] == ["not measured"] * len(GOALS)
    assert {p.name for p in tmp_path.iterdir()} == FILES


@pytest.mark.parametrize(("args", "env_out", "message"), [
    (["--dry-run"], False, "set OUT to the folder the outputs go to"),
    (["--dryrun"], True, "unknown argument --dryrun (takes --dry-run)"),
])
def test_bad_invocations_are_refused_naming_what_is_wrong(tmp_path: Path, args: list[str], env_out: bool,
                                                          message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    if env_out:
        env["OUT"] = str(tmp_path)
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert list(tmp_path.iterdir()) == []
