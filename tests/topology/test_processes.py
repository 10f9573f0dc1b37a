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
    assert derived["processes"]["tts"] == {"stages": ["tts"], "gpus": [], "replicas": 2,
                                           "instances": ["tts#0", "tts#1"]}
    assert derived["processes"]["llm"]["replicas"] == 1


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
