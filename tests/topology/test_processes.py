"""The top-level `processes` mapping: `replicas`, the `unknown-process` rule, derived output."""

from __future__ import annotations

import json

import pytest

from omnictl.topology import validate_text

BASE = """
stages:
  - {name: asr, factory: m.a, process: front, next: llm}
  - {name: llm, factory: m.b, next: tts}
  - {name: tts, factory: m.c, terminal: true, modality: audio}
processes:
"""


def test_replicas_derive_one_instance_name_per_replica() -> None:
    report = validate_text(BASE.lstrip("\n") + "  tts: {replicas: 2}\n  front: {}\n", "t.yaml")
    assert report.valid, [i.format() for i in report.issues]
    topology = report.topology
    assert topology is not None
    assert topology.processes["tts"].replicas == 2
    assert topology.processes["tts"].instances == ("tts#0", "tts#1")
    assert topology.processes["front"].instances == ("front",)  # one replica keeps its name
    assert topology.instances() == ("front", "llm", "tts#0", "tts#1")
    derived = json.loads(json.dumps(report.to_json()))["derived"]
    assert derived["processes"]["tts"] == {"stages": ["tts"], "gpus": [], "replicas": 2, "node": None, "cpus": 1.0,
                                           "instances": ["tts#0", "tts#1"], "elastic": None}
    assert derived["processes"]["llm"]["replicas"] == 1


def test_elastic_replicas_run_between_min_and_max_named_up_to_max(lint) -> None:
    report = validate_text(BASE.lstrip("\n") + "  tts: {replicas: {min: 1, max: 3, idle: 5}}\n", "t.yaml")
    assert report.valid, [i.format() for i in report.issues]
    assert report.topology is not None
    tts = report.topology.processes["tts"]
    assert (tts.replicas, tts.initial, tts.instances) == (3, 1, ("tts#0", "tts#1", "tts#2"))
    assert report.to_json()["derived"]["processes"]["tts"]["elastic"] == {"min": 1, "queue": 4.0, "window": 0.5,
                                                                         "idle": 5.0}
    assert report.topology.processes["llm"].elastic is None and report.topology.processes["llm"].initial == 1


@pytest.mark.parametrize(("value", "field", "message"), [
    ("{min: 0, max: 2}", "replicas", "process 'tts': `replicas`"),
    ("{min: 1}", "replicas", "process 'tts': `replicas`"),
    ("{min: 1, max: 2, idle: -1}", "replicas", "process 'tts': `replicas`"),
    ("{min: 1, max: 2, most: 3}", "replicas", "process 'tts': `replicas`"),
    ("{min: 3, max: 2}", "replicas", "process 'tts': `replicas` has `min` above `max`"),
])
def test_bad_elastic_replicas_are_reported_at_their_line(lint, value: str, field: str, message: str) -> None:
    issues = lint(BASE + f"  tts: {{replicas: {value}}}\n")
    assert [(i.line, i.field) for i in issues] == [(6, field)], [i.format() for i in issues]
    assert issues[0].message.startswith(message), issues[0].message
    assert issues[0].file == "t.yaml" or issues[0].file


def test_unknown_process_is_reported_at_its_key_with_a_suggestion(lint) -> None:
    issues = lint(BASE + "  tts: {replicas: 2}\n  fornt: {replicas: 3}\n")
    assert [(i.rule, i.line, i.column) for i in issues] == [("unknown-process", 7, 3)]
    assert "'fornt'" in issues[0].message and "no stage runs in" in issues[0].message
    assert "did you mean 'front'" in (issues[0].hint or "")


@pytest.mark.parametrize("value", ["0", "-1", '"two"', "1.5", "true"])
def test_bad_replicas_values_are_schema_errors_at_the_value(lint, value: str) -> None:
    issues = lint(BASE + f"  tts: {{replicas: {value}}}\n")
    assert [(i.rule, i.line, i.field) for i in issues] == [("schema", 6, "replicas")]
    assert issues[0].message.startswith("process 'tts': `replicas`")
    assert "at least 1" in issues[0].message + (issues[0].hint or "")


def test_unknown_knob_is_a_schema_error_naming_the_known_ones(lint) -> None:
    issues = lint(BASE + "  tts: {replicas: 2, replica: 3}\n")
    assert [(i.rule, i.line, i.field) for i in issues] == [("schema", 6, "replica")]
    assert issues[0].message == "process 'tts': unknown field `replica`"
    assert "did you mean `replicas`" in (issues[0].hint or "")


def test_processes_must_be_a_mapping(lint) -> None:
    text = BASE.replace("processes:\n", "processes: [tts]\n")
    issues = lint(text)
    assert [(i.rule, i.line, i.field) for i in issues] == [("schema", 5, "processes")]


def test_validate_text_output_shows_replicas() -> None:
    from rich.console import Console

    from omnictl.cli.validate import render_text

    report = validate_text(BASE.lstrip("\n") + "  tts: {replicas: 3}\n", "t.yaml")
    console = Console(record=True, width=120)
    render_text([report], console)
    text = console.export_text()
    assert "5 OS processes with replicas" in text
    row = next(line for line in text.splitlines() if line.startswith("tts "))
    assert row.split() == ["tts", "tts", "cpu", "3"]


NODES = """
stages:
  - {name: asr, factory: m.a, process: front, next: llm}
  - {name: llm, factory: m.b, next: [tts, text], gpu: 0}
  - {name: text, factory: m.d, process: front, terminal: true}
  - {name: tts, factory: m.c, gpu: 0, terminal: true, modality: audio}
processes:
  llm: {node: big, cpus: 4}
  tts: {node: big, cpus: 0.5}
"""


def test_node_labels_derive_tcp_between_labels_and_keep_placement_within_one() -> None:
    from omnictl.topology.model import Transport

    report = validate_text(NODES.lstrip("\n"), "t.yaml")
    assert report.valid, [i.format() for i in report.issues]
    topology = report.topology
    assert topology is not None
    assert topology.processes["llm"].node == "big" and topology.processes["llm"].cpus == 4.0
    assert topology.processes["tts"].cpus == 0.5
    assert topology.processes["front"].node is None and topology.processes["front"].cpus == 1.0
    assert topology.multi_node() and topology.nodes() == (None, "big")
    assert topology.edge("asr", "llm").transport is Transport.TCP  # unlabelled -> big
    assert topology.edge("llm", "text").transport is Transport.TCP  # big -> unlabelled
    assert topology.edge("llm", "tts").transport is Transport.CUDA_IPC  # same label, same GPU
    derived = report.to_json()["derived"]
    assert derived["processes"]["llm"]["node"] == "big" and derived["processes"]["llm"]["cpus"] == 4.0
    asr_llm = [e for e in derived["edges"] if (e["from"], e["to"]) == ("asr", "llm")]
    assert [(e["kind"], e["transport"], e.get("transport_on_cpu", "tcp")) for e in asr_llm] == [("data", "tcp", "tcp")]


def test_on_cpu_keeps_node_labels() -> None:
    from omnictl.topology.derive import on_cpu
    from omnictl.topology.model import Transport

    topology = validate_text(NODES.lstrip("\n"), "t.yaml").topology
    assert topology is not None
    cpu = on_cpu(topology)
    assert cpu.processes["llm"].node == "big" and cpu.processes["llm"].cpus == 4.0
    assert cpu.edge("llm", "tts").transport is Transport.SHM
    assert cpu.edge("asr", "llm").transport is Transport.TCP


@pytest.mark.parametrize(("knob", "value"), [("node", "3"), ("node", '"a b"'), ("cpus", "0"),
                                             ("cpus", '"two"')])
def test_bad_node_and_cpus_values_are_schema_errors(lint, knob: str, value: str) -> None:
    issues = lint(BASE + f"  tts: {{{knob}: {value}}}\n")
    assert [(i.rule, i.line, i.field) for i in issues] == [("schema", 6, knob)]
    assert issues[0].message.startswith(f"process 'tts': `{knob}`")
