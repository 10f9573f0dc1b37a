from __future__ import annotations

import textwrap

from omnictl.topology.yamlnodes import parse


def doc(text: str):
    return parse(textwrap.dedent(text).lstrip("\n"), "t.yaml")


def test_values_keep_their_line_and_column() -> None:
    d = doc("""
        name: x
        stages:
          - name: a
            next: [b, c]
        """)
    assert d.data == {"name": "x", "stages": [{"name": "a", "next": ["b", "c"]}]}
    assert d.position(("stages", 0)) == (3, 5)
    assert d.position(("stages", 0, "next", 1)) == (4, 15)
    assert d.key_position(("stages", 0, "next")) == (4, 5)
    # A path that does not exist falls back to its nearest ancestor.
    assert d.position(("stages", 0, "missing", 3)) == (3, 5)
    assert d.issues == []


def test_duplicate_keys_are_reported_at_the_second_key_and_the_first_is_kept() -> None:
    d = doc("""
        stages:
          - name: a
            factory: m.one
            factory: m.two
        """)
    assert [(i.rule, i.line, i.column, i.stage, i.field) for i in d.issues] == [
        ("duplicate-key", 4, 5, "a", "factory")]
    assert "first at line 3" in d.issues[0].message
    assert d.data["stages"][0]["factory"] == "m.one"


def test_duplicate_top_level_key() -> None:
    d = doc("""
        name: a
        stages: []
        name: b
        """)
    assert [(i.rule, i.line) for i in d.issues] == [("duplicate-key", 3)]


def test_syntax_error_points_at_the_problem() -> None:
    d = doc("""
        stages:
          - name: a
           factory: [unclosed
        """)
    assert len(d.issues) == 1
    assert d.issues[0].rule == "yaml-syntax"
    assert d.issues[0].line == 3
    assert d.data is None


def test_control_characters_are_a_syntax_error_with_a_position() -> None:
    d = parse("stages:\n  - name: a\x07\n", "t.yaml")
    assert [(i.rule, i.line) for i in d.issues] == [("yaml-syntax", 2)]


def test_recursive_alias_is_an_issue_not_a_crash() -> None:
    d = parse("a: &x [1, *x]\n", "t.yaml")
    assert [i.rule for i in d.issues] == ["yaml-syntax"]


def test_merge_keys_fill_in_what_the_mapping_does_not_set() -> None:
    d = doc("""
        base: &base {factory: m.f, process: p}
        stage:
          <<: *base
          process: q
        """)
    assert d.data["stage"] == {"process": "q", "factory": "m.f"}
    assert d.issues == []


def test_unknown_tag_is_reported() -> None:
    d = parse("a: !custom 3\n", "t.yaml")
    assert [(i.rule, i.line) for i in d.issues] == [("yaml-syntax", 1)]


def test_several_documents_are_a_syntax_error() -> None:
    d = parse("a: 1\n---\nb: 2\n", "t.yaml")
    assert [i.rule for i in d.issues] == ["yaml-syntax"]


def test_empty_text_has_no_data_and_no_issue() -> None:
    d = parse("# only a comment\n", "t.yaml")
    assert d.data is None and d.issues == []


def test_an_alias_bomb_stops_at_the_value_cap_quickly() -> None:
    import time

    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\n"
    assert len(text) < 700
    started = time.monotonic()
    d = parse(text, "bomb.yaml")
    assert time.monotonic() - started < 5
    assert d.data is None
    assert [i.rule for i in d.issues] == ["yaml-syntax"] and "more than 100000 values" in d.issues[0].message


def test_a_topology_file_too_large_is_refused_before_parsing(tmp_path) -> None:
    import pytest

    from omnictl.exceptions import TopologyReadError
    from omnictl.topology.validation import MAX_TOPOLOGY_BYTES, read_text

    path = tmp_path / "big.yaml"
    path.write_text("#" * (MAX_TOPOLOGY_BYTES + 1))
    with pytest.raises(TopologyReadError, match="larger than 1024 KiB"):
        read_text(path)


def test_nested_merge_keys_are_flattened_as_pyyaml_does() -> None:
    import yaml

    text = """
        base: &base {factory: m.f, gpu: 0}
        mid: &mid {<<: *base, process: p, gpu: 1}
        stage: {<<: *mid, name: s}
        """
    d = doc(text)
    assert d.issues == []
    assert d.data["stage"] == {"name": "s", "process": "p", "gpu": 1, "factory": "m.f"}
    assert d.data["stage"] == yaml.safe_load(textwrap.dedent(text))["stage"]
