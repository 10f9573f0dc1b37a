"""Moshi's temporal and depth transformers stepped by hand, frame by frame, as the stages step them,
against transformers' ``MoshiForConditionalGeneration`` on the same tiny checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omnictl.models.moshi.model import Depth, Temporal
from omnictl.schedulers.sampling import Sampler, SamplingParams

from .conftest import greedy_mismatches, speechlike, user_codes

GREEDY = Sampler(SamplingParams(temperature=0.0))


@pytest.fixture(scope="module")
def model(moshi_model: Any) -> Any:
    return moshi_model  # (on one thread, as a stage process: conftest's _one_thread)


def session(tiny_moshi: Path, user: torch.Tensor) -> dict[str, Any]:
    """A session stepped as the temporal and depth stages step it: one user frame in, one frame out."""
    temporal, depth = Temporal(tiny_moshi), Depth(tiny_moshi)
    state = temporal.open()
    previous = depth.codes(temporal.step(state, GREEDY, None, None), GREEDY)
    frames, tokens = [], []
    for frame in user:
        step = temporal.step(state, GREEDY, previous, frame)
        codes = depth.codes(step, GREEDY)
        frames.append(torch.cat([previous[:1], codes[1:]]))
        tokens.append(state.tokens[-2])
        previous = codes
    return {
        "codes": torch.stack(frames),
        "text_tokens": tokens,
        "in_flight": {"token": state.tokens[-1], "codes": previous},
    }


def test_a_session_over_silence_is_transformers_generate(model: Any, tiny_moshi: Path) -> None:
    """``generate`` listens to silence after its prompt (one frame of zeros, encoded): the same
    user frames stepped here give its text tokens and audio codes, frame by frame."""
    count = 11
    with torch.inference_mode():
        out = model.generate(
            **model.get_unconditional_inputs(),
            concat_unconditional_inputs=False,
            max_new_tokens=count + 1,
            do_sample=False,
            depth_decoder_do_sample=False,
            return_audio_codes=True,
            return_audio_waveforms=False,
            return_dict_in_generate=True,
        )
        silence = user_codes(model, torch.zeros(1920))
    made = session(tiny_moshi, silence.repeat(count, 1))
    assert made["text_tokens"] == out.sequences[0, 1 : count + 1].tolist()
    assert made["in_flight"]["token"] == int(out.sequences[0, count + 1])
    assert torch.equal(made["codes"], out.audio_codes[0].T)


def test_a_session_on_speech_is_transformers_greedy_moshi(model: Any, tiny_moshi: Path) -> None:
    user = user_codes(model, speechlike(2.0, seed=1))  # 25 frames (test_pipeline.py: 100, served)
    made = session(tiny_moshi, user)
    assert made["codes"].shape == (25, 8)
    assert greedy_mismatches(model, user, made) == []
    # The check can fail: one code changed is found where it is (frame 20's codebook 3 is
    # made at position 22: the codebooks after the first are a position late).
    made["codes"][20, 3] = (made["codes"][20, 3] + 1) % 64
    assert "position 22 codebook 3" in " ".join(greedy_mismatches(model, user, made))
    made["codes"][20, 3] = (made["codes"][20, 3] - 1) % 64
    made["text_tokens"][7] += 1
    assert "text token of frame 7" in " ".join(greedy_mismatches(model, user, made))
