"""The article's 8-stage topology across 3 processes, with torch functions as models."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import omnictl
from tests.support import topo
from tests.support.loop import LoopThread, launch
from tests.support.stages import seen

# Longer than the suite's default deadline: eight stages in several processes, up to ~8 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def qwen(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One launch of the 8-stage topology for the module: the tests below send their own
    requests, each with its own tag in the stages' log, and kill nothing, so its three
    processes are threads of this one (no interpreter importing torch three times; the
    process boundary is exercised by the fault, replica and chaos tests)."""
    folder = tmp_path_factory.mktemp("qwen-shaped")
    log = folder / "seen.log"
    pipe = launch(loop, topo.qwen_shaped(folder, log), device="cpu", profile=False, launcher="threads")
    yield pipe, log
    loop.run(pipe.close())


def ran(log: Path, tag: str) -> set[str]:
    """The stages that ran the request tagged ``tag``."""
    return {stage for stage, tags in seen(log).items() if tag in tags}


def test_eight_stage_pipeline_streams_text_and_audio_and_merges_terminals(
    loop: LoopThread, qwen: tuple[Any, Path]
) -> None:
    pipe, log = qwen

    async def main() -> tuple[list[omnictl.RequestEvent], dict]:
        assert len(pipe.topology.processes) == 3
        request = await pipe.submit({"text": "hello", "tag": "r1"})
        events = [event async for event in request.events()]
        return events, await request.result()

    events, result = loop.run(main())
    assert set(result) == {"decode", "code2wav"}
    assert result["decode"].text == "hello"  # 5 thinker steps over "hello"
    codes = [sum(range(4 * i, 4 * i + 4)) for i in range(5)]
    expected_audio = np.concatenate([np.full(8, c / 100.0, dtype=np.float32) for c in codes])
    np.testing.assert_allclose(result["code2wav"].samples, expected_audio)

    text_events = [e for e in events if e.stage == "decode"]
    assert [e.kind for e in text_events] == ["stream"] * 5 + ["result"]
    assert "".join(e.data.text for e in text_events[:-1]) == "hello"  # in order
    audio_events = [e for e in events if e.stage == "code2wav"]
    assert [e.kind for e in audio_events] == ["stream"] * 5 + ["result"]
    assert ran(log, "r1") == {
        "preprocessing", "image_encoder", "audio_encoder", "mm_aggregate",
        "thinker", "decode", "talker_ar", "code2wav",
    }


def test_text_only_request_never_reaches_the_talker_or_vocoder(loop: LoopThread, qwen: tuple[Any, Path]) -> None:
    pipe, log = qwen

    async def main() -> dict:
        text_only = await (await pipe.submit({"text": "abcd", "tag": "text"}, modalities=["text"])).result()
        both = await (await pipe.submit({"text": "abcd", "tag": "both"})).result()
        assert set(both) == {"decode", "code2wav"}
        return text_only

    result = loop.run(main())
    assert set(result) == {"decode"}
    assert "thinker" in ran(log, "text") and not {"talker_ar", "code2wav"} & ran(log, "text")
    assert {"talker_ar", "code2wav"} <= ran(log, "both")


def test_unknown_modality_is_rejected_with_what_the_topology_produces(loop: LoopThread, qwen: tuple[Any, Path]) -> None:
    pipe, _ = qwen

    async def main() -> None:
        with pytest.raises(omnictl.InvalidRequest, match=r"\['audio', 'text'\]"):
            await pipe.submit({"text": "x"}, modalities=["video"])

    loop.run(main())


def test_run_is_a_synchronous_convenience(tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "t.yaml",
        [
            {"name": "a", "factory": "omnictl.models.examples.append", "factory_args": {"tag": "a"}, "next": ["b"]},
            {"name": "b", "factory": "omnictl.models.examples.append", "factory_args": {"tag": "b"}, "terminal": True},
        ],
    )
    assert omnictl.run(path, {"trail": []}, profile=False) == {"b": {"trail": ["a", "b"]}}
