"""Tensor-parallel groups in the topology: `tp_size` on CPU means N CPU ranks, `validate`
shows each group's ranks, a group spread over two `node` labels and a TP stage sharing its
process are errors at their lines, and `device="cpu"` keeps the group (on CPU ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from omnictl.cli.validate import register
from omnictl.topology import load, loads, validate_text

TP = """\
stages:
  - name: prep
    factory: omnictl.models.examples.identity
    next: [big]
  - name: big
    factory: omnictl.models.examples.identity
    gpu: [0, 1]
    terminal: true
"""

CPU_TP = TP.replace("    gpu: [0, 1]\n", "    tp_size: 3\n")


def _validate(tmp_path: Path, text: str, *args: str) -> tuple[int, str]:
    path = tmp_path / "tp.yaml"
    path.write_text(text)
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A group, so `validate` is a subcommand."""

    register(app)
    result = CliRunner().invoke(app, ["validate", str(path), *args], terminal_width=200)
    return result.exit_code, result.output


def test_tp_size_without_gpu_is_a_group_of_cpu_ranks() -> None:
    topology = loads(CPU_TP)
    big = topology.stages["big"]
    assert (big.tp_size, big.gpu, big.device) == (3, (), "cpu")
    assert [s.name for s in topology.tensor_parallel()] == ["big"]
    assert [big.rank_device(r) for r in range(3)] == ["cpu", "cpu", "cpu"]
    # One OS process per group: rank 0 is the only one the launcher (and the address books) know.
    assert topology.instances() == ("prep", "big")


def test_on_cpu_a_gpu_group_keeps_its_ranks(tmp_path: Path) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(TP)
    big = load(path, device="cpu").stages["big"]
    assert (big.tp_size, big.gpu) == (2, ())
    assert load(path).stages["big"].rank_device(1) == "cuda:1"


def test_validate_shows_the_group_with_each_rank_and_where_it_runs(tmp_path: Path) -> None:
    code, output = _validate(tmp_path, TP)
    assert code == 0, output
    rows = [line.split() for line in output.splitlines()]
    assert ["big", "0", "cuda:0", "-", "stage", "process"] in [r[:6] for r in rows], output
    assert ["1", "cuda:1", "-", "follower"] in rows
    assert "warning" not in output
    code, output = _validate(tmp_path, CPU_TP)
    rows = [line.split() for line in output.splitlines()]
    assert code == 0 and ["2", "cpu", "-", "follower"] in rows, output


def test_validate_json_lists_the_groups(tmp_path: Path) -> None:
    code, output = _validate(tmp_path, CPU_TP, "--format", "json")
    assert code == 0
    assert json.loads(output)["derived"]["tensor_parallel"] == {
        "big": {"process": "big", "tp_size": 3, "ranks": ["cpu", "cpu", "cpu"]}
    }


def test_a_group_over_two_node_labels_is_an_error_at_its_line() -> None:
    text = CPU_TP + "processes:\n  big:\n    node: [left, right]\n"
    issues = validate_text(text, "t.yaml").issues
    assert [(i.rule, i.line, i.field) for i in issues] == [("tp-node", 11, "node")]
    assert "ranks of tensor-parallel stage 'big'" in issues[0].message and "left, right" in issues[0].message
    assert issues[0].format().startswith("t.yaml:11:")
    # One label for the whole group is fine, and so is a list naming one node.
    assert validate_text(CPU_TP + "processes:\n  big:\n    node: left\n", "t.yaml").valid
    assert validate_text(CPU_TP + "processes:\n  big:\n    node: [left]\n", "t.yaml").valid


def test_a_tp_stage_sharing_its_process_is_an_error_at_its_line() -> None:
    text = CPU_TP.replace("    tp_size: 3\n", "    tp_size: 3\n    process: prep\n")
    text = text.replace("    next: [big]\n", "    next: [big]\n    process: prep\n")
    issues = validate_text(text, "t.yaml").issues
    assert [(i.rule, i.line, i.stage) for i in issues] == [("process-placement", 9, "big")]
    assert "tensor-parallel stage 'big' shares process 'prep' with prep" in issues[0].message


@pytest.mark.parametrize("labels", ["[a, b]", "[a, a, b]"])
def test_a_process_without_tp_on_two_nodes_is_an_error_too(labels: str) -> None:
    text = TP.replace("    gpu: [0, 1]\n", "") + f"processes:\n  big:\n    node: {labels}\n"
    issues = validate_text(text, "t.yaml").issues
    assert [i.rule for i in issues] == ["tp-node"] and "runs on one node" in issues[0].message
