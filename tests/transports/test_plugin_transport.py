"""A transport plug-in, installed the way a user installs one (an entry point), carries a
real pipeline's payloads: placement picks it in the coordinator and in every stage process,
and its codec is the one that encodes (no shared-memory slot is ever made for the edge)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from omnictl import Pipeline
from omnictl.topology import load
from omnictl.topology.model import Transport
from omnictl.transports import registry

REPO = Path(__file__).resolve().parents[2]
TEXT = "hellotransport" * 400  # 5,600 letters: 44 KB of int64 ids, past the 16 KB inline limit


def install_plugin(site: Path) -> None:
    """What `pip install` of a package with an `omnictl.transports` entry point leaves behind."""
    dist = site / "omnictl_copy_transport-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omnictl-copy-transport\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omnictl.transports]\ncopy = tests.transports.plugin.copy_transport:PLUGIN\n")


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"omx{pid}_")]


async def run_once(topology: Path) -> tuple[Transport, str, list[str]]:
    async with Pipeline.launch(topology, device="cpu", profile=False) as pipe:
        result = await (await pipe.submit({"text": TEXT})).result()
        edge = pipe.topology.edge("tokenize", "shout").transport
        return edge, result["detokenize"].text, segments_of(pipe.process_ids()["tokenize"])


@pytest.mark.timeout(300)
def test_a_plugin_transport_from_an_entry_point_carries_a_pipelines_payloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = tmp_path / "example"
    shutil.copytree(REPO / "examples" / "three_stages", example)
    topology = example / "topology.yaml"
    expected = (TEXT.upper()) * 2  # shout repeats twice

    # Without the plug-in the edge is shm: the tokenize process lends a slot.
    edge, text, segments = asyncio.run(run_once(topology))
    assert (edge, text) == (Transport.SHM, expected)
    assert segments, "the shm edge should have made a shared-memory segment in the tokenize process"

    site = tmp_path / "site"
    install_plugin(site)
    # this process and every stage process it starts see the installed plug-in
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_PLUGINS", dict(registry._PLUGINS))
    monkeypatch.setattr(registry, "_discovered", False)
    assert load(topology).edge("tokenize", "shout").transport is Transport("copy")
    edge, text, segments = asyncio.run(run_once(topology))
    assert (edge, text) == (Transport("copy"), expected)
    assert segments == []  # the plug-in's codec copied the payload into the message
