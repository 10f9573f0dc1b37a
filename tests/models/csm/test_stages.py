"""CSM's stages in this process, without the runtime: the prompt, the frame loop's two halves, the topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import SpeechRequest
from omnictl.models.csm.backbone import BackboneRunner
from omnictl.models.csm.depth import DepthDecoder
from omnictl.models.csm.stages import Preprocessor, conversation
from omnictl.schedulers.sampling import Sampler, SamplingParams
from omnictl.serving.common.capabilities import capabilities
from omnictl.topology import load

from .conftest import FRAMES, TEXT

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "csm.yaml"


def test_the_prompt_is_transformers_own(tiny_csm: Path, reference: dict[str, Any]) -> None:
    prompt = Preprocessor(tiny_csm)(SpeechRequest(text=TEXT, voice="alloy"))
    assert torch.equal(prompt["input_ids"], reference["input_ids"])


def test_backbone_and_depth_decoder_make_transformers_greedy_frames(tiny_csm: Path, reference: dict[str, Any]) -> None:
    """The two halves of the frame loop, stepped by hand as the scheduler and the depth stage do."""
    backbone, depth = BackboneRunner(tiny_csm), DepthDecoder(tiny_csm)
    greedy = Sampler(SamplingParams(temperature=0.0))
    output = backbone.prefill("r", {"input_ids": reference["input_ids"]})
    made = []
    for _ in range(FRAMES):
        first = int(torch.argmax(output.logits))
        assert not backbone.ready("r")  # its frame is out at the depth decoder
        frame = depth.frame(first, output.hidden, greedy)
        backbone.feed("r", {"frame": frame}, done=False)
        made.append(frame)
        output = backbone.decode(["r"], [first])[0]
    assert torch.equal(torch.stack(made), reference["codes"])
    backbone.release("r")
    assert backbone.kv_slots() == 0


def test_an_end_frame_stops_the_backbone(tiny_csm: Path) -> None:
    backbone = BackboneRunner(tiny_csm)
    backbone.prefill("r", {"input_ids": torch.tensor([[0, 1]])})
    backbone.feed("r", {"frame": torch.zeros(backbone.codebooks, dtype=torch.long)}, done=False)
    scores = backbone.decode(["r"], [0])[0].logits
    assert int(torch.argmax(scores)) == backbone.end_id and backbone.stop_token_ids() == {backbone.end_id}


def test_speech_and_chat_requests_become_csm_turns() -> None:
    assert conversation({"text": "hi", "voice": "1"}) == [{"role": "1", "content": [{"type": "text", "text": "hi"}]}]
    turns = conversation(
        {"messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    )
    assert [(t["role"], t["content"][0]["text"]) for t in turns] == [("0", "a"), ("0", "b")]
    with pytest.raises(InvalidRequest) as error:
        conversation(SpeechRequest(text="hi", voice="ethan"))
    assert error.value.field == "voice"
    with pytest.raises(InvalidRequest) as error:
        conversation(SpeechRequest(text="hi", speed=1.5))
    assert error.value.field == "speed"


def test_the_topology_serves_speech_and_chat() -> None:
    endpoints = capabilities(load(TOPOLOGY)).endpoints()
    assert "/v1/audio/speech" in endpoints and "/v1/chat/completions" in endpoints
