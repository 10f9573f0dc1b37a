"""Across real processes: a stage that keeps what it received (views of the sender's
slots) never sees it change, however many payloads follow through the same pool."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

S = "tests.support.stages"


def test_tensors_a_stage_keeps_stay_intact_while_the_sender_keeps_sending(loop: LoopThread, tmp_path: Path) -> None:
    path = topo.write(tmp_path / "hoard.yaml", [
        # two 1 MiB slots: the held payloads take both, the rest need segments of their own
        {"name": "a", "factory": "omnictl.models.examples.identity", "next": ["b"], "process": "one",
         "relay": {"slot_bytes": 1 << 20, "slots": 2}},
        {"name": "b", "factory": f"{S}.hoarder", "factory_args": {"keep": 3}, "terminal": True, "process": "two"},
    ])
    pipe = launch(loop, path, profile=False, launcher="threads")  # kills nothing: replicas as threads

    async def send(i: int) -> dict:
        blob = torch.full((200_000,), float(i))  # 800 KB: fits a slot
        return (await (await pipe.submit({"i": i, "blob": blob})).result())["b"]

    try:
        for i in range(30):
            out = loop.run(send(i))
            assert out == {"i": i, "held": min(i + 1, 3), "intact": True}
        # exactly what b keeps; the 27 others came back (releases travel asynchronously)
        assert until(lambda: loop.run(pipe.stats())["a"]["slots_in_use"] == 3, timeout=10)
        assert loop.run(pipe.stats())["a"]["slots_in_use"] == 3  # and stays there
    finally:
        loop.run(pipe.close())
