"""The article's 8-stage topology across 3 processes, with torch functions as models."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import omnictl
from tests.support import topo
from tests.support.stages import seen


# Longer than the suite's default deadline: eight stages in several processes, up to ~8 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)


def test_eight_stage_pipeline_streams_text_and_audio_and_merges_terminals(tmp_path: Path) -> None:
    log = tmp_path / "seen.log"
    path = topo.qwen_shaped(tmp_path, log)

    async def main() -> tuple[list[omnictl.RequestEvent], dict]:
        async with omnictl.Pipeline.launch(path, device="cpu", profile=False) as pipe:
            assert len(pipe.topology.processes) == 3
            request = await pipe.submit({"text": "hello", "tag": "r1"})
            events = [event async for event in request.events()]
            return events, await request.result()

    events, result = asyncio.run(main())
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
    assert set(seen(log)) == {
        "preprocessing", "image_encoder", "audio_encoder", "mm_aggregate",
        "thinker", "decode", "talker_ar", "code2wav",
    }


def test_text_only_request_never_reaches_the_talker_or_vocoder(tmp_path: Path) -> None:
    log = tmp_path / "seen.log"
    path = topo.qwen_shaped(tmp_path, log)

    async def main() -> dict:
        async with omnictl.Pipeline.launch(path, device="cpu", profile=False) as pipe:
            text_only = await (await pipe.submit({"text": "abcd", "tag": "text"}, modalities=["text"])).result()
            both = await (await pipe.submit({"text": "abcd", "tag": "both"})).result()
            assert set(both) == {"decode", "code2wav"}
            return text_only

    result = asyncio.run(main())
    assert set(result) == {"decode"}
    ran = seen(log)
    assert "text" not in ran["talker_ar"] and "text" not in ran["code2wav"]
    assert "text" in ran["thinker"] and "both" in ran["talker_ar"]


def test_unknown_modality_is_rejected_with_what_the_topology_produces(tmp_path: Path) -> None:
    path = topo.qwen_shaped(tmp_path, tmp_path / "seen.log")

    async def main() -> None:
        async with omnictl.Pipeline.launch(path, device="cpu", profile=False) as pipe:
            with pytest.raises(omnictl.InvalidRequest, match=r"\['audio', 'text'\]"):
                await pipe.submit({"text": "x"}, modalities=["video"])

    asyncio.run(main())


def test_run_is_a_synchronous_convenience(tmp_path: Path) -> None:
    path = topo.write(
        tmp_path / "t.yaml",
        [
            {"name": "a", "factory": "omnictl.models.examples.append", "factory_args": {"tag": "a"}, "next": ["b"]},
            {"name": "b", "factory": "omnictl.models.examples.append", "factory_args": {"tag": "b"}, "terminal": True},
        ],
    )
    assert omnictl.run(path, {"trail": []}, profile=False) == {"b": {"trail": ["a", "b"]}}
