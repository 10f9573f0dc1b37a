from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator

from omnictl.topology.schema import load_schema, schema_path

REPO = Path(__file__).resolve().parents[2]

BASE = """
stages:
  - name: a
    factory: m.a
    next: [b]
  - name: b
    factory: m.b
    terminal: true
"""


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_schema_is_read_from_the_package_data() -> None:
    # One source: the package's copy, in a checkout too (tests/test_package_data.py keeps
    # schemas/ identical to it for editors).
    assert schema_path() == REPO / "omnictl" / "data" / "topology.schema.json"
    assert load_schema() == json.loads(schema_path().read_text())


def test_valid_topology_has_no_schema_issue(lint) -> None:
    assert lint(BASE, "schema") == []


def test_unknown_stage_field_is_reported_at_its_key_with_a_suggestion(lint) -> None:
    issues = lint(BASE.replace("    next: [b]", "    next: [b]\n    procss: p"), "schema")
    assert [(i.line, i.column, i.stage, i.field) for i in issues] == [(5, 5, "a", "procss")]
    assert "unknown field `procss`" in issues[0].message
    assert "did you mean `process`" in (issues[0].hint or "")


def test_unknown_top_level_field(lint) -> None:
    issues = lint("nmae: x\n" + BASE.lstrip("\n"), "schema")
    assert [(i.line, i.field) for i in issues] == [(1, "nmae")]
    assert "did you mean `name`" in (issues[0].hint or "")


def test_transport_in_relay_is_an_error_whose_hint_says_it_is_derived(lint) -> None:
    issues = lint(BASE.replace("    next: [b]", "    next: [b]\n    relay:\n      slots: 4\n"
                               "      transport: shm"), "schema")
    assert [(i.line, i.column, i.field) for i in issues] == [(7, 7, "transport")]
    assert "derived from placement" in (issues[0].hint or "")


def test_relay_knobs_are_accepted(lint) -> None:
    text = BASE.replace("    next: [b]", "    next: [b]\n    relay: {slot_bytes: 1024, slots: 2, "
                        "inline_bytes: 0}")
    assert lint(text) == []


def test_the_inbox_bound_is_a_relay_knob_of_at_least_one(lint) -> None:
    assert lint(BASE.replace("    next: [b]", "    next: [b]\n    relay: {inbox: 4}")) == []
    issues = lint(BASE.replace("    next: [b]", "    next: [b]\n    relay: {inbox: 0}"), "schema")
    assert [(i.line, i.stage, i.field) for i in issues] == [(5, "a", "relay")]
    assert "less than the minimum of 1" in issues[0].message


def test_missing_factory_is_reported_at_the_stage(lint) -> None:
    issues = lint(BASE.replace("    factory: m.b\n", ""), "schema")
    assert [(i.line, i.stage, i.field) for i in issues] == [(5, "b", "factory")]
    assert "missing required field `factory`" in issues[0].message


def test_wrong_types_point_at_the_value(lint) -> None:
    text = BASE.replace("    terminal: true", "    terminal: yes please\n    gpu: [0, x]")
    issues = lint(text, "schema")
    assert [(i.line, i.field) for i in issues] == [(7, "terminal"), (8, "gpu")]
    assert "`gpu` must be a GPU id" in issues[1].message


def test_bad_dotted_path_and_bad_name(lint) -> None:
    issues = lint(BASE.replace("factory: m.a", "factory: nodots").replace("name: b", "name: b c")
                  .replace("next: [b]", "next: [b c]"), "schema")
    assert [(i.line, i.field) for i in issues] == [(3, "factory"), (4, "next"), (5, "name")]


def test_modality_only_on_terminals(lint) -> None:
    issues = lint(BASE.replace("    next: [b]", "    next: [b]\n    modality: text"), "schema")
    assert [(i.line, i.stage, i.field) for i in issues] == [(5, "a", "modality")]
    assert lint(BASE.replace("terminal: true", "terminal: true\n    modality: text")) == []


def test_a_topology_that_is_not_a_mapping(lint) -> None:
    issues = lint("- just\n- a list\n")
    assert [(i.rule, i.line) for i in issues] == [("schema", 1)]
    assert "must be a mapping" in issues[0].message


def test_an_empty_file_is_an_error(lint) -> None:
    assert [i.rule for i in lint("# nothing\n")] == ["schema"]


def test_shipped_topologies_name_the_schema_for_editors() -> None:
    files = sorted((REPO / "topologies").glob("*.yaml"))
    assert files
    for file in files:
        first = file.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../schemas/topology.schema.json", file


def test_a_stage_that_is_not_a_mapping(lint) -> None:
    issues = lint(BASE + "  - just a string\n", "schema")
    assert [(i.line, i.column) for i in issues] == [(8, 5)]
    assert "stages[2]: a stage must be a mapping" in issues[0].message
