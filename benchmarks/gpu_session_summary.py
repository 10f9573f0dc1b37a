"""The summary of a GPU device session (``benchmarks/gpu_session.sh``): its ``summary.txt`` and
``results.json`` from what the steps left in the session's work folder.

Standard library only: it runs even where the session's setup failed. A benchmark stopped
at its time limit leaves the rates it finished in its ``--json``; the goals are then judged
here over those rates, by the benchmark's own rule (and the summary says so).

Run by the session script: ``python3 benchmarks/gpu_session_summary.py WORK OUT DRY MODE
SECONDS LIMIT`` (DRY ``1`` for the dry run).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

FIRST_AUDIO_GOAL_S = 0.300
STAGED_RATE_FACTOR = 2.0
DEADLINE_RATE_FACTOR = 1.5
IPC_GOAL_GBS = 100.0


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a step that failed or was cut off before it wrote
        return None


def steps(path: Path) -> list[dict[str, Any]]:
    """The runner's table: name, outcome, exit code, seconds, limit (tab-separated)."""
    rows = []
    for line in path.read_text().splitlines():
        name, outcome, code, took, budget = line.split("\t")
        rows.append({"step": name, "outcome": outcome, "exit": code, "seconds": int(took), "limit_s": int(budget)})
    return rows


def open_loop_verdict(open_loop: dict[str, Any]) -> tuple[dict[str, float] | None, bool | None, bool]:
    """(sustained rates, staged >= 2x monolithic, judged here from partial rates).
    The benchmark's own verdict when it finished; else its rule (``keeps_up``: p90 first
    audio within the target and the last request done within twice the target of the last
    arrival; the highest rate that keeps up) over the rates both sides finished."""
    rates = open_loop.get("sustained_per_s")
    if rates is not None:
        return rates, (open_loop.get("goals") or {}).get("staged_rate_2x_monolithic"), False
    target = open_loop.get("target_p90_first_audio_s")
    both = {float(r): s for r, s in (open_loop.get("rates") or {}).items() if {"staged", "monolithic"} <= set(s)}
    if not both or target is None:
        return None, None, False

    def best(side: str) -> float:
        ok = [r for r, s in both.items() if s[side]["first_audio_p90_s"] <= target and s[side]["drain_s"] <= 2 * target]
        return max(ok) if ok else 0.0

    staged, mono = best("staged"), best("monolithic")
    met = staged > 0 if mono == 0 else staged >= STAGED_RATE_FACTOR * mono
    return {"staged": staged, "monolithic": mono, "highest_offered": max(both)}, met, True


def continuity_verdict(qwen: dict[str, Any]) -> tuple[dict[str, float | None] | None, bool | None, bool]:
    """(highest rate each policy sustains, deadline >= 1.5x fifo, judged here from partial
    rates). The benchmark's own verdict when it finished; else its rule
    (``highest_sustained``: the highest rate up to which every rate kept p95 largest
    underrun within 100 ms; no fifo rate: deadline must sustain one) over the rates both
    policies finished."""
    sustained = qwen.get("sustained_per_s")
    if sustained is not None:
        return sustained, next((g["met"] for g in qwen.get("goals", []) if "1.5x" in g["goal"]), None), False
    by_config = qwen.get("rates") or {}
    common = sorted(set(by_config.get("fifo", {})) & set(by_config.get("deadline", {})), key=float)
    if not common:
        return None, None, False
    best: dict[str, float | None] = {}
    for config in ("fifo", "deadline"):
        best[config] = None
        for rate in common:
            if not by_config[config][rate]["sustained"]:
                break
            best[config] = float(rate)
    fifo, deadline = best["fifo"], best["deadline"]
    met = deadline is not None if fifo is None else (deadline is not None and deadline >= DEADLINE_RATE_FACTOR * fifo)
    return best, met, True


def memory_peaks(samples: Path, open_loop: Any, continuity: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(peak GPU memory per step, peak memory per process), in MiB; each process named by the
    pids the benchmarks recorded, else as the sampler saw it."""
    names: dict[str, str] = {}
    if open_loop:
        names.update({str(pid): f"open_loop {proc}" for proc, pid in (open_loop.get("stage_pids") or {}).items()})
        if open_loop.get("monolithic_pid"):
            names[str(open_loop["monolithic_pid"])] = "open_loop monolithic (and the launcher)"
    if continuity:
        for part in continuity.get("topologies", {}).values():
            for config, pids in (part.get("stage_pids") or {}).items():
                names.update({str(pid): f"continuity {config} {proc}" for proc, pid in pids.items()})
    per_step: dict[str, int] = {}
    per_process: dict[str, int] = {}
    with open(samples) as f:
        for row in csv.DictReader(f):
            if row["gpu_memory_used_mib"]:
                per_step[row["step"]] = max(per_step.get(row["step"], 0), int(float(row["gpu_memory_used_mib"])))
            if row["pid"] and row["process_memory_mib"]:
                key = f"{row['step']}: {names.get(row['pid'], row['process'])} (pid {row['pid']})"
                per_process[key] = max(per_process.get(key, 0), int(float(row["process_memory_mib"])))
    return per_step, per_process


def fmt(x: float | None, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f} {unit}"


def per_s(rate: float | None) -> str:
    return "no rate tried" if rate is None else f"{rate:g}/s"


def summarize(work: Path, out: Path, dry: bool, mode: str, seconds: int, limit: int) -> str:
    """Write ``summary.txt`` and ``results.json`` into ``out``; returns the summary."""
    versions, ipc, open_loop, continuity = (load(work / n) for n in ("versions.json", "cuda_ipc.json",
                                                                      "open_loop.json", "continuity.json"))
    ran = steps(work / "steps.tsv")
    per_step, per_process = memory_peaks(out / "gpu-memory.csv", open_loop, continuity)
    cut_off = []
    goals: list[tuple[str, bool | None]] = []  # (text, met; None: not measured)

    one = (open_loop or {}).get("staged_one")
    first_audio = one["first_audio_s"] if one else None
    goals.append((f"first audio at one request, Qwen3-Omni released widths on one H200 <= "
                  f"{FIRST_AUDIO_GOAL_S * 1000:.0f} ms: staged {fmt(first_audio, 'ms', 1000, 0)}",
                  None if first_audio is None else first_audio <= FIRST_AUDIO_GOAL_S))
    rates, staged_met, partial = open_loop_verdict(open_loop or {})
    if partial:
        cut_off.append("open_loop")
    target = (open_loop or {}).get("target_p90_first_audio_s")
    goals.append((f"staged sustains >= {STAGED_RATE_FACTOR:g}x the monolithic rate at the same first-audio p90 "
                  f"(<= {fmt(target)}): "
                  + (f"staged {rates['staged']:g}/s, monolithic {rates['monolithic']:g}/s" if rates else "-"),
                  staged_met))
    qwen = ((continuity or {}).get("topologies") or {}).get("qwen") or {}
    sustained, deadline_met, partial = continuity_verdict(qwen)
    if partial:
        cut_off.append("continuity")
    goals.append((f"deadline sustains >= {DEADLINE_RATE_FACTOR:g}x fifo's rate without an underrun over 100 ms "
                  "(p95): "
                  + (f"deadline {per_s(sustained.get('deadline'))}, fifo {per_s(sustained.get('fifo'))}"
                     if sustained else "-"),
                  deadline_met))
    gbs = (ipc or {}).get("gb_per_s")
    goals.append((f"cuda_ipc moves a 64 MiB tensor between two processes on one GPU at >= {IPC_GOAL_GBS:g} GB/s: "
                  f"{fmt(gbs, 'GB/s', 1, 1)}" + (f" ({ipc['transport']}, {ipc['mib']} MiB)" if ipc else ""),
                  None if ipc is None else bool(ipc.get("met"))))

    lines = [f"omnictl GPU session ({mode}): {seconds} s of the {limit} s limit"]
    if versions:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "executable"))
    lines += ["", "steps:"]
    for s in ran:
        lines.append(f"  {s['step']:<11} {s['outcome']:<9} exit {s['exit']:<3} {s['seconds']:>4} s "
                     f"(limit {s['limit_s']} s)")
    lines += ["", "figures:"]
    if ipc:
        lines.append(f"  transfer ({ipc['transport']}, {ipc['mib']} MiB, round trip): median {ipc['median_ms']:.3f} ms "
                     f"= {ipc['gb_per_s']:.1f} GB/s (best {ipc['best_gb_per_s']:.1f})")
    if open_loop:
        lines.append(f"  checkpoint {open_loop.get('size')}: {open_loop.get('params_m', 0):.0f} M parameters; thinker "
                     f"decode step {fmt(open_loop.get('thinker_step_ms'), 'ms', 1, 1)}; monolithic unloaded "
                     f"{fmt(open_loop.get('monolithic_unloaded_s'))}")
        if one:
            lines.append(f"  staged at one request: first text {fmt(one['first_text_s'], 'ms', 1000, 0)}, first audio "
                         f"{fmt(one['first_audio_s'], 'ms', 1000, 0)}, done {fmt(one['total_s'])}")
        for rate, sides in (open_loop.get("rates") or {}).items():
            for side, f in sides.items():
                lines.append(f"  {rate:>7}/s {side:<10} first audio p50 {fmt(f['first_audio_p50_s'])} p90 "
                             f"{fmt(f['first_audio_p90_s'])}, done {f['completed_per_s']:.2f}/s, "
                             f"drain {fmt(f['drain_s'])}")
        if rates:
            lines.append(f"  sustained: staged {rates['staged']:g}/s, monolithic {rates['monolithic']:g}/s "
                         f"(highest offered {rates['highest_offered']:g}/s)")
    for config, by_rate in (qwen.get("rates") or {}).items():
        for rate, f in by_rate.items():
            lines.append(f"  continuity {config:<8} {rate:>5}/s: played {f['played']}/{f['requests']}, p95 largest "
                         f"underrun {fmt(f['underrun_p95_s'], 'ms', 1000, 0)}, TTFP p90 "
                         f"{fmt(f['ttfp_p90_s'], 'ms', 1000, 0)}")
    if sustained:
        lines.append("  continuity sustained (p95 largest underrun <= 100 ms): "
                     + ", ".join(f"{c} {per_s(r)}" for c, r in sustained.items()))
    lines.append("  peak GPU memory per step (MiB): " + (", ".join(f"{k} {v}" for k, v in per_step.items()) or "-"))
    lines.append("  peak memory per process (MiB" + (", host RSS on the CPU" if dry else "") + "):")
    for key, mib in sorted(per_process.items()):
        lines.append(f"    {key}: {mib}")
    lines.append("")
    if cut_off:
        lines.append(f"(judged from the rates measured before the time ran out: {', '.join(cut_off)})")
    note = " [dry run: tiny sizes on the CPU, not the goal's conditions]" if dry else ""
    for text, met in goals:
        verdict = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"goal: {text} -> {verdict}{note}")
    summary = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(summary)
    document = {"mode": mode, "dry_run": dry, "seconds": seconds, "limit_s": limit, "versions": versions,
                "steps": ran, "cuda_ipc": ipc, "open_loop": open_loop, "continuity": continuity,
                "peak_gpu_memory_mib_per_step": per_step, "peak_memory_mib_per_process": per_process,
                "goals": [{"goal": t, "met": m} for t, m in goals], "judged_from_partial_rates": cut_off}
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print("usage: gpu_session_summary.py WORK OUT DRY MODE SECONDS LIMIT", file=sys.stderr)
        return 2
    work, out, dry, mode, seconds, limit = argv
    print(summarize(Path(work), Path(out), dry == "1", mode, int(seconds), int(limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
