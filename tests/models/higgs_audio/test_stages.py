"""Higgs Audio v2's stages in this process, without the runtime: the prompt, the generator
stepped as the scheduler steps it, the streaming decoder, the topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import SpeechRequest
from omnictl.models.higgs_audio.codec import AudioTokenizer, audio_tokenizer_path
from omnictl.models.higgs_audio.generator import GeneratorRunner
from omnictl.models.higgs_audio.stages import Preprocessor, audio_decoder, conversation
from omnictl.schedulers.sampling import SamplingParams
from omnictl.schedulers.streaming import Window
from omnictl.serving.common.capabilities import capabilities
from omnictl.topology import load

from .conftest import FRAMES, TEXT, generate

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "higgs-audio.yaml"


def test_the_prompt_is_the_processors(tiny_higgs: Path, reference: dict[str, Any]) -> None:
    prompt = Preprocessor(tiny_higgs)(SpeechRequest(text=TEXT, voice="alloy"))
    assert torch.equal(prompt["input_ids"], reference["input_ids"])


def run_generator(runner: GeneratorRunner, input_ids: torch.Tensor, steps: int) -> tuple[list[int], Any, Any]:
    """The runner stepped as the autoregressive scheduler steps it (greedy), its frames taken each step."""
    runner.set_sampling("r", SamplingParams(temperature=0.0))
    output = runner.prefill("r", {"input_ids": input_ids})
    tokens, frames, codes = [], [], []
    for _ in range(steps):
        token = int(torch.argmax(output.logits))
        tokens.append(token)
        new_frames, new_codes = runner.take("r", final=False)
        frames.append(new_frames)
        codes.append(new_codes)
        if token in runner.stop_token_ids():
            break
        output = runner.decode(["r"], [token])[0]
    runner.release("r")
    return tokens, torch.cat(frames), torch.cat(codes)


def test_the_generator_makes_transformers_greedy_frames_and_tokens(tiny_higgs: Path, reference: dict[str, Any]) -> None:
    runner = GeneratorRunner(tiny_higgs)
    tokens, frames, codes = run_generator(runner, reference["input_ids"], FRAMES)
    assert tokens == reference["tokens"]  # audio, delay ... then end of turn: the model ended by itself
    assert tokens[-1] == runner.eos_token and len(tokens) < FRAMES
    assert torch.equal(frames, reference["frames"])  # every codebook of every frame, delayed as generated
    assert torch.equal(codes, reference["codes"])  # the delay undone, frame by frame as each completed
    assert len(set(codes.flatten().tolist())) > 10  # the codes vary: the comparison can fail
    assert runner.kv_slots() == 0
    runner.forget("r")


def test_a_request_cut_at_max_tokens_gives_transformers_frames(tiny_higgs: Path) -> None:
    cut = generate(tiny_higgs, 12)
    tokens, frames, codes = run_generator(GeneratorRunner(tiny_higgs), cut["input_ids"], 12)
    assert tokens == cut["tokens"] and torch.equal(frames, cut["frames"]) and torch.equal(codes, cut["codes"])
    assert len(codes) == 12 - 8  # the first frame is all begin codes, then 7 frames of the delay


def windows(codes: torch.Tensor, sizes: list[int], left: int) -> list[Window]:
    """The windows the streaming scheduler makes of ``codes`` arriving in ``sizes`` pieces, then the end."""
    made, done, context = [], 0, codes[:0]
    for size in sizes:
        new = codes[done : done + size]
        made.append(Window("r", {}, context, new, len(made), final=False))
        done += size
        context = codes[max(done - left, 0) : done]
    made.append(Window("r", {}, context, codes[:0], len(made), final=True))  # flush_on_end's window
    return made


def test_the_streaming_decoder_is_the_audio_tokenizers_decode(tiny_higgs: Path, reference: dict[str, Any]) -> None:
    codes = reference["codes"]
    whole = AudioTokenizer(audio_tokenizer_path(tiny_higgs)).decode(codes)
    np.testing.assert_allclose(whole, reference["audio"], atol=1e-6)  # the processor's decode
    stage = audio_decoder(tiny_higgs)
    sizes = [4, 4, 1, 4, 4, 1]  # 18 frames
    assert sum(sizes) == len(codes)
    outputs = [stage.process_chunk(window) for window in windows(codes, sizes, left=8)]
    pieces = [output.samples for output in outputs if output is not None]
    assert outputs[0] is None  # the first 4 frames wait for the 4 after them
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-6)
    assert len(np.concatenate(pieces)) == len(codes) * 960


def test_speech_and_chat_requests_become_higgs_turns() -> None:
    assert conversation({"text": "hi"})[-1] == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    chat = conversation({"messages": [{"role": "user", "content": "b"}]})
    assert [t["role"] for t in chat] == ["system", "user"]
    for request, field in [
        (SpeechRequest(text="hi", voice="ethan"), "voice"),
        (SpeechRequest(text="hi", speed=1.5), "speed"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "messages"),
    ]:
        with pytest.raises(InvalidRequest) as error:
            conversation(request)
        assert error.value.field == field


def test_text_spelling_a_special_token_is_refused(tiny_higgs: Path) -> None:
    with pytest.raises(InvalidRequest, match="<\\|AUDIO_OUT\\|>"):
        Preprocessor(tiny_higgs)({"text": "say <|AUDIO_OUT|> now"})


def test_the_topology_serves_speech_and_chat() -> None:
    endpoints = capabilities(load(TOPOLOGY)).endpoints()
    assert "/v1/audio/speech" in endpoints and "/v1/chat/completions" in endpoints
