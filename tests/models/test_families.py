"""The family registry (omnictl/models/families.py): every family listed once, each with a
package that is there and topologies that validate, every shipped topology owned by a family
(or named an example), and what each serves derived from its topology's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnictl.models.families import (
    EXAMPLE_TOPOLOGIES,
    FAMILIES,
    Family,
    TopologyNotShipped,
    UnknownFamily,
    families,
    family,
    for_architecture,
    installed,
    mounted,
    routes,
    topology_path,
)
from omnictl.topology import load, validate

REPO = Path(__file__).resolve().parents[2]


def test_each_family_is_listed_once_by_name_package_topology_and_page() -> None:
    for key in ("name", "package", "docs"):
        values = [getattr(f, key) for f in FAMILIES]
        assert len(values) == len(set(values)), (key, values)
    files = [file for f in FAMILIES for file in f.topologies]
    assert len(files) == len(set(files)), files
    architectures = [a for f in FAMILIES for a in f.architectures]
    assert len(architectures) == len(set(architectures)), architectures


@pytest.mark.parametrize("entry", FAMILIES, ids=lambda f: f.name)
def test_each_family_has_its_package_its_page_and_topologies_that_validate(entry: Family) -> None:
    if not installed(entry):
        pytest.skip(f"{entry.name} is still being added: its package or topology is not in this checkout")
    assert (REPO / entry.docs).is_file(), entry.docs
    for file in entry.topologies:
        path = topology_path(file)
        report = validate(path)
        assert report.valid, [issue.format() for issue in report.issues]
        load(path, find_imports=True)  # a factory that certainly does not exist fails here, naming it
    assert load(topology_path(entry.topology)).name == entry.name  # `omnictl models NAME` is the topology's name
    if entry.checkpoint is not None:
        assert entry.checkpoint == f"python -m {entry.package}.tiny DIR"
        assert installed(Family(**{**entry.__dict__, "package": entry.package + ".tiny"}))


def test_every_shipped_topology_belongs_to_a_family_or_is_an_example() -> None:
    owned = {file for f in FAMILIES for file in f.topologies} | set(EXAMPLE_TOPOLOGIES)
    shipped = {p.name for p in (REPO / "topologies").glob("*.yaml")}
    assert shipped - owned == set(), "add a Family to omnictl/models/families.py for these"
    assert owned - shipped == set()


def test_routes_come_from_the_topology_less_what_the_model_refuses() -> None:
    assert routes(family("qwen3-asr")) == ["/v1/realtime", "/v1/audio/transcriptions"]  # transcription sessions
    assert mounted(family("qwen3-asr")) == ["/v1/realtime", "/v1/audio/transcriptions", "/v1/audio/translations"]
    assert routes(family("csm")) == ["/v1/chat/completions", "/v1/realtime", "/v1/audio/speech"]
    assert routes(family("qwen3-omni")) == ["/v1/chat/completions", "/v1/realtime"]
    assert "/v1/audio/speech" in routes(family("voice-assistant"))
    for entry in FAMILIES:  # a refused route is one the shape mounts: the list cannot drift
        assert set(entry.refuses) <= set(mounted(entry)), entry.name


def test_a_family_is_found_by_name_and_by_architecture_and_errors_name_the_choices() -> None:
    assert family("csm").package == "omnictl.models.csm"
    assert for_architecture("Qwen3OmniMoeForConditionalGeneration") is family("qwen3-omni")
    assert for_architecture("LlamaForCausalLM") is None
    with pytest.raises(UnknownFamily, match="no model family named 'qwen9'; omnictl serves: voice-assistant, "):
        family("qwen9")
    with pytest.raises(TopologyNotShipped, match="not in the wheel"):
        topology_path("no-such-family.yaml")


def test_the_families_that_landed_are_listed_and_one_still_being_added_is_not() -> None:
    listed = [f.name for f in families()]
    assert {"voice-assistant", "qwen3-omni", "csm", "qwen3-asr"} <= set(listed)
    assert listed == [f.name for f in FAMILIES if f.name in listed]  # in the registry's order, once each
    no_package = Family("ghost", "Ghost", "omnictl.models.no_such_family", ("csm.yaml",), (), ("hf",), None, "x.md")
    no_topology = Family("ghost", "Ghost", "omnictl.models.csm", ("ghost.yaml",), (), ("hf",), None, "x.md")
    assert not installed(no_package) and not installed(no_topology)
    assert installed(family("csm"))


def test_a_checkpoint_picks_its_family_by_the_architecture_its_config_names(tmp_path: Path) -> None:
    import json

    from omnictl.models.families import for_checkpoint

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CsmForConditionalGeneration"]}))
    assert for_checkpoint(tmp_path) is family("csm")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UnknownFamily, match=r"names architectures \['LlamaForCausalLM'\]; omnictl serves .*\(csm\)"):
        for_checkpoint(tmp_path)
    with pytest.raises(UnknownFamily, match="cannot read the checkpoint's architectures"):
        for_checkpoint(tmp_path / "missing")
