"""The topology's entry points: request preparation, routing, transcription hand-off, merging."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from omnictl.exceptions import InvalidRequest
from omnictl.inputs import SpeechRequest, parse_request
from omnictl.models.voice_assistant import stages
from benchmarks.eval.samples import sample_question, sample_request
from omnictl.outputs import TextResult, Transcript


def test_a_typed_question_goes_straight_to_the_thinker_as_plain_chat() -> None:
    data = stages.prepare_question(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]}
    )
    assert data == {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]}
    assert stages.route_input(data) == "thinker"
    assert stages.merge_question({"preprocessing": data}) == data


def test_a_spoken_question_goes_to_asr_with_16khz_audio_and_no_raw_bytes() -> None:
    data = stages.prepare_question(sample_request("capital_of_france"))
    assert stages.route_input(data) == "asr"
    assert data["messages"] == [{"role": "user", "content": [{"type": "audio", "key": "m0_p0"}]}]
    samples, rate = sample_question("capital_of_france")
    assert rate == 16_000
    np.testing.assert_allclose(data["audio"]["m0_p0"], samples)
    assert "base64" not in repr(data["messages"])  # the encoded WAV was dropped, only its samples go on


def test_the_typed_request_from_the_server_prepares_like_the_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    typed = parse_request(sample_request("capital_of_france", voice="joe"))
    monkeypatch.setattr(base64, "b64decode", lambda *a, **k: pytest.fail("the entry stage decoded audio again"))
    data = stages.prepare_question(typed)
    samples, _ = sample_question("capital_of_france")
    assert data["messages"] == [{"role": "user", "content": [{"type": "audio", "key": "m0_p0"}]}]
    np.testing.assert_allclose(data["audio"]["m0_p0"], samples)


class HeardEverything:
    """Stands in for Whisper in this unit: says what it was given, by length, and in which language."""

    def recognize(self, samples: np.ndarray, sample_rate: int, language: str | None = None) -> tuple[str, str]:
        return f"{samples.size / sample_rate:.1f} seconds", language or "en"


def test_transcripts_replace_spoken_parts_and_the_audio_is_dropped() -> None:
    one_second = np.zeros(16_000, dtype=np.int16)
    data = stages.prepare_question(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Listen:"}, {"type": "input_audio", "input_audio": {"data": one_second, "format": "wav"}}]},
                {"role": "assistant", "content": "OK."},
            ]
        }
    )
    out = stages.transcribe_question(HeardEverything(), data)  # type: ignore[arg-type]
    assert out == {"messages": [{"role": "user", "content": "Listen: 1.0 seconds"}, {"role": "assistant", "content": "OK."}],
                   "transcript": Transcript(text="1.0 seconds", language="en", duration=1.0)}
    merged = stages.merge_question({"asr": out})
    assert merged == {"messages": out["messages"]}  # exactly one prompt key for the LLM runner


def test_the_requested_language_reaches_the_recognizer() -> None:
    request = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": np.zeros(8000, np.float32)}}]}],
               "language": "fr"}
    out = stages.transcribe_question(HeardEverything(), stages.prepare_question(request))  # type: ignore[arg-type]
    assert out["transcript"] == Transcript(text="0.5 seconds", language="fr", duration=0.5)
    with pytest.raises(InvalidRequest) as caught:
        parse_request({**request, "language": "french!"})
    assert caught.value.field == "language"


def test_text_to_speak_goes_straight_to_tts() -> None:
    data = stages.prepare_question(SpeechRequest(text="Say this.", voice="joe"))
    assert data == {"speak": TextResult(text="Say this.")}
    assert stages.route_input(data) == "tts"
    assert stages.merge_answer({"preprocessing": data}) == TextResult(text="Say this.")
    answer = TextResult(text="Paris.", prompt_tokens=3, completion_tokens=2)
    assert stages.merge_answer({"thinker": answer}) is answer
    with pytest.raises(InvalidRequest) as caught:
        stages.prepare_question(SpeechRequest(text="hi", voice="nobody"))
    assert caught.value.field == "voice"
    with pytest.raises(InvalidRequest) as caught:
        SpeechRequest(text="  ")
    assert caught.value.field == "input"


def test_images_and_unknown_voices_are_refused_naming_the_part() -> None:
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8).decode()
    with pytest.raises(InvalidRequest) as caught:
        stages.prepare_question({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}}]}]})
    assert caught.value.field == "messages[0].content[0].image_url.url"
    with pytest.raises(InvalidRequest) as caught:
        stages.prepare_question({"messages": [{"role": "user", "content": "hi"}], "voice": "alloy"})
    assert caught.value.field == "voice" and "joe" in str(caught.value)


def test_merge_without_an_upstream_is_an_error() -> None:
    with pytest.raises(ValueError, match="asr"):
        stages.merge_question({})


@pytest.mark.parametrize("bad", [[5, 2], [0, 3], [3], [3, "five"]])
def test_the_tts_first_words_setting_is_checked_naming_it(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="factory_args.first_words"):
        stages.tts(first_words=bad)  # type: ignore[arg-type]
