"""Placement rules: tp-size and process-placement."""

from __future__ import annotations

PLACED = """
stages:
  - name: a
    factory: m.a
    process: front
    gpu: 0
    next: [b]
  - name: b
    factory: m.b
    process: front
    next: [big]
  - name: big
    factory: m.big
    gpu: [1, 2]
    tp_size: 2
    terminal: true
"""


def where(issues):
    return [(i.line, i.column, i.stage, i.field) for i in issues]


def test_placed_topology_is_valid(lint) -> None:
    assert lint(PLACED) == []


def test_tp_size_must_match_the_gpu_list(lint) -> None:
    issues = lint(PLACED.replace("tp_size: 2", "tp_size: 3"), "tp-size")
    assert where(issues) == [(14, 14, "big", "tp_size")]


def test_tp_size_defaults_to_the_gpu_list_length(lint) -> None:
    assert lint(PLACED.replace("    tp_size: 2\n", "")) == []


def test_tp_size_above_one_beside_a_single_gpu_is_an_error(lint) -> None:
    issues = lint(PLACED.replace("gpu: [1, 2]", "gpu: 1"), "tp-size")
    assert where(issues) == [(14, 14, "big", "tp_size")]
    assert "single GPU" in issues[0].message and "drop `gpu` to run 2 CPU ranks" in issues[0].hint


def test_tp_size_without_gpu_means_cpu_ranks(lint) -> None:
    assert lint(PLACED.replace("    gpu: [1, 2]\n", "")) == []


def test_negative_and_repeated_gpu_ids(lint) -> None:
    issues = lint(PLACED.replace("gpu: [1, 2]", "gpu: [-1, 1, 1]").replace("tp_size: 2", "tp_size: 3"),
                  "tp-size")
    assert [(i.line, i.column) for i in issues] == [(13, 11), (13, 18)]
    assert "negative" in issues[0].message and "twice" in issues[1].message
    issues = lint(PLACED.replace("gpu: 0", "gpu: -2"), "tp-size")
    assert where(issues) == [(5, 10, "a", "gpu")]


def test_tensor_parallel_stage_owns_its_process(lint) -> None:
    text = PLACED.replace("    tp_size: 2\n", "    tp_size: 2\n    process: front\n")
    issues = lint(text, "process-placement")
    assert where(issues) == [(15, 14, "big", "process")]
    assert "shares process 'front' with a, b" in issues[0].message


def test_gpu_stages_of_one_process_share_one_gpu(lint) -> None:
    issues = lint(PLACED.replace("process: front\n    next: [big]",
                                 "process: front\n    gpu: 3\n    next: [big]"),
                  "process-placement")
    assert where(issues) == [(10, 10, "b", "gpu")]
    assert "a on 0, b on 3" in issues[0].message
    # A CPU stage beside a GPU stage is fine (that is what b is in PLACED).
    assert lint(PLACED, "process-placement") == []
