"""The output contract: constructors check their fields; check_output names what broke;
the types cross a process boundary (the payload codec) as the same types."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnictl.outputs import (
    AudioChunk,
    AudioResult,
    FinishReason,
    TextDelta,
    TextResult,
    TokenDelta,
    TokenResult,
    check_output,
)
from omnictl.transports.packing import _mark_structs, pack, unpack


def roundtrip(data: object) -> object:
    packed = pack(data)
    return unpack(packed.skeleton, packed.layout, packed.to_bytes())


def test_constructors_reject_wrong_fields_naming_the_type_and_field() -> None:
    with pytest.raises(TypeError, match="TextDelta: text must be a str, got int"):
        TextDelta(text=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="finish_reason must be one of stop, length, got 'done'"):
        TextResult(text="x", finish_reason="done")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="completion_tokens must be an integer >= 0"):
        TextResult(text="x", completion_tokens=-1)
    with pytest.raises(TypeError, match="AudioChunk: sample_rate must be a positive integer"):
        AudioChunk(samples=np.zeros(4, np.float32), sample_rate=0)
    with pytest.raises(TypeError, match=r"mono \(1-D\), got shape \(2, 3\)"):
        AudioResult(samples=np.zeros((2, 3), np.float32), sample_rate=16_000)
    with pytest.raises(TypeError, match="samples must be a numpy array or a torch tensor, got str"):
        AudioChunk(samples="static", sample_rate=16_000)  # type: ignore[arg-type]


def test_audio_samples_become_float32_mono_from_tensors_int16_and_columns() -> None:
    assert AudioChunk(samples=torch.ones(1, 5, dtype=torch.float64), sample_rate=8000).samples.dtype == np.float32
    pcm = AudioChunk(samples=np.array([16384, -32768], dtype=np.int16), sample_rate=8000).samples
    assert pcm.tolist() == [0.5, -1.0]
    assert AudioChunk(samples=np.zeros((7, 1)), sample_rate=8000).samples.shape == (7,)


def test_plain_keeps_only_the_contract_fields() -> None:
    rich = TokenResult(text="hi", finish_reason="length", prompt_tokens=2, completion_tokens=3, token_ids=[7, 8])
    assert rich.plain() == TextResult(text="hi", finish_reason=FinishReason.LENGTH, prompt_tokens=2, completion_tokens=3)
    assert type(rich.plain()) is TextResult


def test_finish_reason_is_an_enum_also_when_given_as_text() -> None:
    assert TextResult(text="x", finish_reason="length").finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("modality", "final", "data", "problem"),
    [
        ("text", False, TextDelta(text="a"), None),
        ("text", False, TokenDelta(text="a", token_ids=[1]), None),  # a subclass satisfies the contract
        ("text", True, TokenResult(text="a"), None),
        ("text", True, TextDelta(text="a"), "result must be omnictl.outputs.TextResult, got TextDelta"),
        ("text", False, {"text": "a"}, "stream chunk must be omnictl.outputs.TextDelta, got a dict with keys ['text']"),
        ("audio", False, AudioChunk(samples=np.zeros(2), sample_rate=8000), None),
        ("audio", True, AudioResult(samples=np.zeros(2), sample_rate=8000), None),
        ("audio", True, AudioChunk(samples=np.zeros(2), sample_rate=8000), "result must be omnictl.outputs.AudioResult, got AudioChunk"),
        ("audio", False, AudioResult(samples=np.zeros(2), sample_rate=8000), "stream chunk must be omnictl.outputs.AudioChunk"),
        ("video", True, {"anything": 1}, None),
    ],
)
def test_check_output(modality: str, final: bool, data: object, problem: str | None) -> None:
    found = check_output(modality, final, data)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and repr(modality) in found


def test_outputs_keep_their_types_and_buffers_across_the_payload_codec() -> None:
    samples = np.linspace(-1, 1, 50_000, dtype=np.float32)
    sent = {
        "audio": AudioResult(samples=samples, sample_rate=24_000, transcript="hi"),
        "tokens": [TokenDelta(text="a", token_ids=[1, 2], hidden=torch.arange(6.0).reshape(2, 3))],
        "text": TextResult(text="done", finish_reason=FinishReason.LENGTH, prompt_tokens=3, completion_tokens=4),
    }
    packed = pack(sent)
    assert b"hi" in packed.skeleton and packed.nbytes >= samples.nbytes  # samples travel as a raw buffer
    got = roundtrip(sent)
    assert isinstance(got, dict)
    audio, token, text = got["audio"], got["tokens"][0], got["text"]
    assert isinstance(audio, AudioResult) and np.array_equal(audio.samples, samples) and audio.transcript == "hi"
    assert isinstance(token, TokenDelta) and token.token_ids == [1, 2] and torch.equal(token.hidden, sent["tokens"][0].hidden)
    assert text == sent["text"] and text.finish_reason is FinishReason.LENGTH


def test_plain_containers_without_structs_are_not_copied_by_packing() -> None:
    data = {"ids": [1, 2, 3], "nested": {"x": "y"}}
    assert _mark_structs(data) is data
    assert roundtrip(data) == data


@pytest.mark.parametrize(
    ("pieces", "joined"),
    [
        (["The capital of France", "is Paris."], "The capital of France is Paris."),
        (["Hello,", " there.", "Bye."], "Hello, there. Bye."),  # a piece that has its space keeps only it
        (["Hi. ", "Bye."], "Hi. Bye."),
        (["", "Hi.", "", "Bye."], "Hi. Bye."),  # a piece with no words adds nothing, not a stray space
    ],
)
def test_the_transcript_deltas_of_tts_pieces_join_with_one_space(pieces: list[str], joined: str) -> None:
    from omnictl.outputs import transcript_delta

    spoken = ""
    for words in pieces:
        spoken += transcript_delta(spoken, words)
    assert spoken == joined
