"""`omnictl validate --graph`: the derived topology as a Mermaid flowchart."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from omnictl.cli.main import app
from omnictl.topology import load
from omnictl.topology.graph import mermaid

REPO = Path(__file__).resolve().parents[2]


def test_every_stage_process_and_edge_is_drawn_with_its_transport() -> None:
    topology = load(REPO / "topologies" / "voice-assistant.yaml")
    text = mermaid(topology)
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    assert "  client([client]) --> s_preprocessing" in lines
    for process in topology.processes.values():
        assert any(line.startswith(f"  subgraph p_{process.name}[") for line in lines), process.name
    for edge in topology.edges:
        arrow = "-.->" if edge.kind.value == "stream" else "-->"
        label = f"stream, {edge.transport.value}" if edge.kind.value == "stream" else edge.transport.value
        assert f"  s_{edge.src} {arrow}|{label}| s_{edge.dst}" in lines, edge
    assert '    s_tts[["tts<br/>→ audio"]]' in lines  # a terminal shows its modality
    assert text.count("subgraph") == len(topology.processes) == text.count("\n  end")


def test_replicas_and_names_mermaid_would_misread(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nstages:\n"
                    "  - {name: end, factory: m.a, next: [b-2]}\n"
                    "  - {name: b-2, factory: m.b, terminal: true, modality: text}\n"
                    "processes:\n  b-2: {replicas: 3}\n")
    text = mermaid(load(path))
    assert "s_end -->|shm| s_b_2" in text  # `end` is a Mermaid keyword; `-` is not an id character
    assert 'p_b_2["process b-2 (cpu, 3 replicas)"]' in text


def test_cli_prints_the_graph_and_reports_invalid_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  - {name: a, factory: m.a, next: [ghost]}\n")
    good = REPO / "examples" / "three_stages" / "topology.yaml"
    result = CliRunner().invoke(app, ["validate", "--graph", str(good)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("flowchart LR\n")
    assert "s_tokenize -->|shm| s_shout" in result.output
    result = CliRunner().invoke(app, ["validate", "--graph", str(good), str(bad)])
    assert result.exit_code == 1
    assert f"%% {good}" in result.output and "unknown-stage" in result.output
