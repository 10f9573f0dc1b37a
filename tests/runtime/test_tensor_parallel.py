"""Tensor-parallel stage groups over real processes: a causal LM at tp_size 2 (two CPU
ranks over gloo, the model sharded with its transformers tp plan) beside the same model at
tp_size 1, in one pipeline; requests go to either (or both) by a route_fn.

The model is a random-weight Llama (4 attention heads, 2 KV heads: both split over two
ranks; SmolLM2-135M has 9 and 3, which two ranks cannot split, see test_tensor_parallel in
tests/models)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

import omnictl
from omnictl.models.tiny_causal_lm import tiny_llama, tiny_tokenizer
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.wait import until

# Two launches' worth of stage processes (each imports torch; a group loads twice) plus a
# group restart, on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(240)

LM = "omnictl.models.hf_causal_lm.causal_lm"
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tp-llama")
    tiny_llama(seed=3, hidden_size=64, layers=2, eos=False).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pipe(loop: LoopThread, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    lm = {"factory": LM, "factory_args": {"model_path": str(checkpoint), "max_batch": 64}, "terminal": True}
    path = topo.write(
        tmp_path_factory.mktemp("tp") / "tp.yaml",
        [
            {"name": "front", "factory": "omnictl.models.examples.identity",
             "route_fn": "omnictl.models.examples.route_by_kind", "next": ["solo", "group"], "process": "solo"},
            {"name": "solo", **lm},  # beside `front`: one process fewer to start
            {"name": "group", **lm, "tp_size": 2},
        ],
    )
    pipeline = launch(loop, path, profile=False, max_restarts=1)
    yield pipeline
    loop.run(pipeline.close())


def ask(prompt: str, route: str | list[str], max_tokens: int = 24) -> dict[str, Any]:
    return {"prompt": prompt, "route": route, "sampling": {**GREEDY, "max_tokens": max_tokens}}


async def _results(pipe: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    handles = [await pipe.submit(r) for r in requests]
    return list(await asyncio.gather(*(h.result() for h in handles)))


def test_tp2_greedy_output_equals_tp1_token_for_token(loop: LoopThread, pipe: Any) -> None:
    prompts = ["hello world", "tensor parallel", "a", "the quick brown fox jumps over"]
    # Concurrent: the group decodes them as one batch (left padding, per-request positions).
    results = loop.run(_results(pipe, [ask(p, ["solo", "group"]) for p in prompts]))
    for prompt, result in zip(prompts, results):
        solo, group = result["solo"], result["group"]
        assert len(solo.token_ids) == 24, prompt
        assert group.token_ids == solo.token_ids, prompt
    # Different prompts, different answers: the comparison above is not between constants.
    assert len({tuple(r["solo"].token_ids) for r in results}) == len(prompts)


def test_address_books_hold_one_entry_per_group(pipe: Any) -> None:
    coordinator = pipe._coordinator
    # Rank 0 is the stage process; the follower is the group's own business.
    assert sorted(coordinator.wiring.process_addresses) == ["group", "solo"]
    assert sorted(coordinator.launcher.handles) == ["group", "solo"]
    rank0 = coordinator.launcher.handles["group"].pid
    followers = _children(rank0)
    assert len(followers) == 1 and followers[0] not in {h.pid for h in coordinator.launcher.handles.values()}


def test_fifty_aborts_leave_no_state_on_any_rank(loop: LoopThread, pipe: Any) -> None:
    async def abort_all() -> None:
        handles = [await pipe.submit(ask(f"abort me {i}", "group", max_tokens=4000)) for i in range(50)]
        await asyncio.sleep(0.5)  # some prefilled and decoding, some still queued
        for handle in handles:
            await handle.abort()
        for handle in handles:
            with pytest.raises(omnictl.RequestAborted):
                await handle.result()

    loop.run(abort_all())

    def clean() -> bool:
        group = loop.run(pipe.stats())["group"]
        return group["kv_slots"] == 0 and group.get("rank_kv_slots") == [0] and group["requests"] == 0

    assert until(clean, timeout=20), loop.run(pipe.stats())["group"]


def test_a_killed_follower_fails_the_groups_requests_naming_the_rank_and_the_group_restarts(
    loop: LoopThread, pipe: Any
) -> None:
    coordinator = pipe._coordinator
    rank0 = coordinator.launcher.handles["group"].pid
    (follower,) = _children(rank0)

    async def kill_mid_generation() -> tuple[str, dict[str, Any]]:
        doomed = await pipe.submit(ask("generate for long", "group", max_tokens=4000))
        bystander = await pipe.submit(ask("hello world", "solo", max_tokens=200))
        async for event in doomed.events():  # generating: its first tokens are out
            break
        os.kill(follower, signal.SIGKILL)
        with pytest.raises(omnictl.RequestFailed) as failed:
            await doomed.result()
        return str(failed.value), await bystander.result()

    error, bystander = loop.run(kill_mid_generation())
    assert "tensor-parallel rank 1" in error and "SIGKILL" in error and "'group'" in error, error
    assert len(bystander["solo"].token_ids) == 200  # the other stage's request is unaffected
    # The whole group restarts (rank 0 too: a group never serves short a rank), and serves.
    assert until(lambda: coordinator.launcher.handles["group"].restarts == 1 and pipe.healthy, timeout=90)
    assert coordinator.launcher.handles["group"].pid != rank0
    result = loop.run(_results(pipe, [ask("back again", ["solo", "group"])]))[0]
    assert result["group"].token_ids == result["solo"].token_ids


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as file:
            children += [int(c) for c in file.read().split()]
    return children
