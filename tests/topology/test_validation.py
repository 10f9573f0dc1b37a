"""The library API: validate / load / loads, derivation, and never crashing on bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnictl.exceptions import TopologyError
from omnictl.topology import (
    EdgeKind,
    RelayKnobs,
    TopologyReadError,
    Transport,
    load,
    loads,
    validate,
    validate_text,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_topology_is_valid(path: Path) -> None:
    report = validate(path)
    assert [i.format() for i in report.issues] == []
    assert report.valid and report.topology is not None


def test_the_article_topology_derives_entry_terminals_processes_and_transports() -> None:
    topology = load(REPO / "topologies" / "qwen3-omni.yaml")
    assert topology.name == "qwen3-omni"
    assert topology.model_path is None
    assert topology.entry == "preprocessing"
    assert dict(topology.terminals) == {"decode": "text", "code2wav": "audio"}
    assert {n: (p.stages, p.gpus) for n, p in topology.processes.items()} == {
        "frontend": (("preprocessing", "image_encoder", "audio_encoder", "mm_aggregate"), (0,)),
        "thinker": (("thinker", "decode"), (0,)),
        "talker": (("talker_ar", "code2wav"), (1,)),
    }
    assert len(topology.stages) == 8
    assert topology.edge("preprocessing", "audio_encoder").transport is Transport.INPROC
    assert topology.edge("mm_aggregate", "thinker").transport is Transport.CUDA_IPC
    assert topology.edge("thinker", "talker_ar").transport is Transport.RELAY
    assert topology.edge("thinker", "talker_ar", EdgeKind.STREAM).transport is Transport.RELAY
    assert topology.edge("thinker", "decode", EdgeKind.STREAM).transport is Transport.INPROC
    assert topology.upstreams("mm_aggregate") == ("preprocessing", "image_encoder",
                                                  "audio_encoder")
    thinker = topology.stages["thinker"]
    assert thinker.project == {"decode": "omnictl.models.qwen3_omni.stages.project_for_decode"}
    assert thinker.device == "cuda:0" and thinker.tp_size == 1
    assert topology.stages["decode"].modality == "text"
    assert topology.stages["thinker"].modality is None


def test_the_voice_assistant_runs_on_cpu_with_shared_memory_between_processes() -> None:
    topology = load(REPO / "topologies" / "voice-assistant.yaml")
    assert topology.edge("preprocessing", "asr").transport is Transport.INPROC
    assert topology.edge("asr", "thinker").transport is Transport.SHM
    assert topology.stages["preprocessing"].route_fn == (
        "omnictl.models.voice_assistant.stages.route_input")
    assert topology.stages["thinker"].wait_for == ("preprocessing", "asr")


def test_stage_specs_resolve_their_defaults_and_remember_their_line() -> None:
    topology = loads(textwrap.dedent("""
        model_path: /models/x
        stages:
          - name: a
            factory: m.a
            factory_args: {layers: 2}
            gpu: [0, 1]
            next: b
            relay: {slots: 3}
          - name: b
            factory: m.b
            terminal: true
        """))
    a, b = topology.stages["a"], topology.stages["b"]
    assert (a.process, a.tp_size, a.gpu, a.next, a.line) == ("a", 2, (0, 1), ("b",), 4)
    assert a.factory_args == {"layers": 2}
    assert a.relay == RelayKnobs(slots=3)
    assert (b.process, b.modality, b.gpu, b.line) == ("b", "b", (), 10)
    assert topology.name == "topology" and topology.model_path == "/models/x"
    assert topology.edge("a", "b").transport is Transport.SHM


def test_load_on_cpu_drops_gpu_placement_and_keeps_processes() -> None:
    topology = load(REPO / "topologies" / "qwen3-omni.yaml", device="cpu")
    assert all(not s.gpu for s in topology.stages.values())
    assert set(topology.processes) == {"frontend", "thinker", "talker"}
    assert topology.edge("thinker", "talker_ar").transport is Transport.SHM
    with pytest.raises(ValueError, match="device"):
        load(REPO / "topologies" / "qwen3-omni.yaml", device="tpu")


def test_invalid_text_raises_topology_error_with_every_issue() -> None:
    with pytest.raises(TopologyError) as caught:
        loads("stages:\n  - name: a\n    factory: m.a\n", "bad.yaml")
    assert {i.rule for i in caught.value.issues} == {"routing-mode", "dead-end"}
    assert "bad.yaml:2:5: routing-mode" in str(caught.value)


def test_unreadable_files_raise_a_distinct_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyReadError, match="missing.yaml"):
        validate(tmp_path / "missing.yaml")
    with pytest.raises(TopologyReadError):
        load(tmp_path)  # a directory
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(TopologyReadError) as caught:
        validate(latin)
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)


def test_report_json_shape() -> None:
    good = validate(REPO / "topologies" / "two-heads.yaml").to_json()
    assert good["valid"] is True and good["errors"] == []
    assert good["derived"]["entry"] == "ingest"
    assert good["derived"]["terminals"] == {"audio_head": "audio", "video_head": "video"}
    assert good["derived"]["processes"]["heads"] == {"stages": ["audio_head", "video_head"],
                                                     "gpus": [], "replicas": 1,
                                                     "instances": ["heads"], "node": None, "cpus": 1.0, "elastic": None}
    assert {"from": "backbone", "to": "video_head", "kind": "data",
            "transport": "shm", "transport_on_cpu": "shm"} in good["derived"]["edges"]
    # what `serve --device cpu` uses where the placement says a GPU transport
    edges = validate(REPO / "topologies" / "qwen3-omni.yaml").to_json()["derived"]["edges"]
    assert {"from": "mm_aggregate", "to": "thinker", "kind": "data",
            "transport": "cuda_ipc", "transport_on_cpu": "shm"} in edges
    assert {"from": "thinker", "to": "talker_ar", "kind": "stream",
            "transport": "relay", "transport_on_cpu": "shm"} in edges
    bad = validate_text("stages: 3\n", "b.yaml").to_json()
    assert bad["valid"] is False and bad["derived"] is None
    assert set(bad["errors"][0]) == {"rule", "stage", "field", "line", "column", "message",
                                     "hint", "follows_from"}


MANY_MISTAKES = """\
name: broken
stages:
  - name: preprocessing
    factory: app.pre
    next: [encoder, thinkr]
  - name: encoder
    factory: app.enc
    gpu: [0, 1]
    tp_size: 4
    process: shared
    next: [thinker]
  - name: thinker
    factory: app.think
    process: shared
    wait_for: [encoder]
    next: [decode]
    terminal: true
  - name: decode
    factory: app.decode
    factory: app.decode2
    relay: {transport: shm}
    next: [decode]
"""


def test_a_file_with_many_mistakes_gets_all_of_them_at_the_right_lines() -> None:
    report = validate_text(MANY_MISTAKES, "many.yaml")
    found = [(i.rule, i.line) for i in report.issues]
    assert found == [  # root causes first, each part in file order
        ("unknown-stage", 5),  # thinkr
        ("duplicate-key", 20),  # factory twice
        ("schema", 21),  # relay.transport
        ("self-reference", 22),  # decode -> decode
        ("tp-size", 9),  # tp_size 4 vs two GPUs
        ("process-placement", 10),  # tensor-parallel encoder shares `shared`
        ("fan-in-pair", 15),  # wait_for without merge_fn
        ("routing-mode", 17),  # terminal with next
        ("dead-end", 18),  # decode only leads to itself: never a terminal
    ]
    assert not report.valid and report.topology is None


JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=20,
)
FIELDS = ["name", "factory", "next", "route_fn", "terminal", "modality", "wait_for",
          "merge_fn", "gpu", "tp_size", "process", "stream_to", "project", "relay",
          "factory_args", "bogus"]
NAMES = st.sampled_from(["a", "b", "c", "d"])
FIELD_VALUES = (JSON_VALUES | NAMES | st.lists(NAMES, max_size=3)
                | st.integers(-2, 3) | st.lists(st.integers(-1, 2), max_size=3)
                | st.just("m.f") | st.dictionaries(NAMES, st.just("m.p"), max_size=2))
STAGES = st.lists(st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=8),
                  max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_validator(text: str) -> None:
    report = validate_text(text, "fuzz.yaml")
    assert report.valid == (report.topology is not None)
    for issue in report.issues:
        assert issue.line >= 1 and issue.column >= 1 and issue.rule


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(JSON_VALUES, st.fixed_dictionaries({"stages": STAGES})))
def test_arbitrary_structures_never_crash_the_validator(data: object) -> None:
    text = yaml.safe_dump(data)
    report = validate_text(text, "fuzz.yaml")
    assert report.valid == (report.topology is not None)
    if report.topology is not None:
        assert report.topology.entry in report.topology.stages
        assert set(report.topology.terminals) <= set(report.topology.stages)
    report.to_json()  # always serialisable into the CLI's shape


TWO_TYPOS = """\
name: typos
stages:
  - name: prep
    factory: app.prep
    next: [answr, speak]
  - name: answer
    factory: app.answer
    terminal: true
  - name: speak
    factory: app.speak
    nxt: [voice]
  - name: voice
    factory: app.voice
    terminal: true
"""

CYCLE = """\
name: loop
stages:
  - name: a
    factory: app.a
    next: [b]
  - name: b
    factory: app.b
    next: [c]
  - name: c
    factory: app.c
    next: [b, d]
  - name: d
    factory: app.d
    terminal: true
"""


def test_two_typos_come_first_and_what_follows_from_them_says_so() -> None:
    issues = validate_text(TWO_TYPOS, "typos.yaml").issues
    assert [(i.rule, i.line) for i in issues[:2]] == [("unknown-stage", 5), ("schema", 11)]
    follow_ons = issues[2:]
    assert follow_ons, "the typos leave stages without an incoming edge or a way to a terminal"
    for issue in follow_ons:
        assert issue.follows_from in ("unknown-stage at 5:12", "schema at 11:5"), issue
        assert issue.hint is None, "advice for a consequence would send the user the wrong way"
        assert "follows from" in issue.format()
    assert {i.rule for i in follow_ons} <= {"entry", "unreachable", "dead-end", "routing-mode"}


def test_a_cycle_comes_first_and_gets_no_wait_for_advice() -> None:
    issues = validate_text(CYCLE, "loop.yaml").issues
    assert issues[0].rule == "cycle"
    fan_in = next(i for i in issues if i.rule == "fan-in-sources")
    assert fan_in.follows_from == f"cycle at {issues[0].line}:{issues[0].column}"
    assert fan_in.hint is None and "wait_for" not in fan_in.format().split("\n", 1)[-1]


def test_independent_problems_are_not_marked() -> None:
    text = TWO_TYPOS.replace("nxt: [voice]", "next: [voice]").replace("answr", "answer")
    text += "  - name: lonely\n    factory: app.lonely\n    terminal: true\n"
    issues = validate_text(text, "lonely.yaml").issues
    assert issues and all(i.follows_from is None for i in issues)


def test_a_misspelt_wait_for_or_terminal_marks_what_follows_instead_of_advising_against_it() -> None:
    # `wait_fr` leaves `merge_fn` alone ("remove merge_fn" would be wrong advice); `terminl`
    # leaves `modality` on a non-terminal ("remove modality" would be too).
    text = ("stages:\n  - {name: a, factory: m.a, next: [b, c]}\n  - {name: b, factory: m.b, next: [c]}\n"
            "  - {name: c, factory: m.c, terminl: true, modality: text, wait_fr: [a, b], merge_fn: m.merge}\n")
    issues = validate_text(text, "typo.yaml").issues
    roots = [i for i in issues if i.follows_from is None]
    assert [(i.rule, i.field) for i in roots] == [("schema", "terminl"), ("schema", "wait_fr")]
    follows = {(i.rule, i.follows_from) for i in issues if i.follows_from}
    assert ("fan-in-pair", "schema at 4:60") in follows
    assert ("schema", "schema at 4:29") in follows  # `modality` on a non-terminal
    assert all(i.hint is None for i in issues if i.follows_from)


def test_modality_on_a_real_non_terminal_keeps_its_hint() -> None:
    text = "stages:\n  - {name: a, factory: m.a, next: [b], modality: text}\n  - {name: b, factory: m.b, terminl: true}\n"
    issues = validate_text(text, "t.yaml").issues
    modality = next(i for i in issues if "modality" in i.message)
    assert modality.follows_from is None and modality.hint and "remove it" in modality.hint
