"""IncrementalTranscriber on real Whisper base: words confirmed while the audio arrives,
deltas that add up to the final transcript, which is the whole-utterance decode's."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.eval.quality import word_errors
from benchmarks.eval.samples import sample_question, sample_text
from omnictl.audio import resample
from omnictl.models.voice_assistant.asr import SAMPLE_RATE, SpeechRecognizer
from omnictl.models.voice_assistant.incremental_asr import IncrementalSettings, IncrementalTranscriber, WhisperDecoder

CHUNK = SAMPLE_RATE // 10  # 100 ms


@pytest.fixture
def decoder(whisper_decoder: WhisperDecoder) -> WhisperDecoder:
    return whisper_decoder  # the package's one Whisper (conftest.py)


@pytest.fixture
def whole_decode(shipped_recognizer: SpeechRecognizer) -> SpeechRecognizer:
    """The whole-utterance recogniser the final transcript is compared with (the shipped asr
    settings; the same model as ``decoder``): loaded once for the package, not per question."""
    return shipped_recognizer


def question(name: str) -> np.ndarray:
    samples, rate = sample_question(name)
    return resample(samples, rate, SAMPLE_RATE)


def stream(transcriber: IncrementalTranscriber, audio: np.ndarray) -> list[tuple[int, str]]:
    """Feed ``audio`` in 100 ms chunks; (samples fed so far, delta) for each delta."""
    deltas = []
    for offset in range(0, audio.size, CHUNK):
        delta = transcriber.feed(audio[offset : offset + CHUNK])
        if delta:
            deltas.append((min(offset + CHUNK, audio.size), delta))
    return deltas


def test_words_are_confirmed_while_the_audio_arrives_and_add_up_to_the_transcript(decoder: WhisperDecoder) -> None:
    audio = question("largest_planet")
    transcriber = IncrementalTranscriber(decoder, IncrementalSettings(cadence_s=0.4))
    deltas = stream(transcriber, audio)
    streamed = "".join(delta for _, delta in deltas)
    assert streamed == transcriber.confirmed_text
    final = transcriber.finish()
    assert len(deltas) >= 2, deltas  # several words confirmed, at different times
    assert deltas[0][0] < audio.size - SAMPLE_RATE  # the first over a second before the end
    assert final.startswith(streamed) and transcriber.confirmed_text == final  # the tail goes on after them
    assert word_errors(sample_text("largest_planet"), final)[0] == 0, final


@pytest.mark.parametrize("name", ["capital_of_france", "spider_legs"])
def test_the_final_transcript_is_the_whole_utterance_decode(
    decoder: WhisperDecoder, whole_decode: SpeechRecognizer, name: str
) -> None:
    audio = question(name)
    whole = whole_decode.transcribe(audio)
    transcriber = IncrementalTranscriber(decoder, IncrementalSettings(cadence_s=0.3))
    stream(transcriber, audio)
    final = transcriber.finish()
    assert word_errors(whole, final)[0] == 0, (whole, final)
    assert word_errors(sample_text(name), final)[0] == 0, final


def test_after_a_quiet_tail_nothing_is_left_to_decode(decoder: WhisperDecoder) -> None:
    audio = np.concatenate([question("capital_of_france"), np.zeros(SAMPLE_RATE // 2, np.float32)])
    finals = []
    for quiet_rms, decodes_at_the_end in ((0.01, 0), (0.0, 1)):
        transcriber = IncrementalTranscriber(decoder, IncrementalSettings(cadence_s=0.4, quiet_rms=quiet_rms))
        stream(transcriber, audio[: audio.size - SAMPLE_RATE // 2])  # the question
        transcriber.tentative()  # its pause: the transcript so far, decoded as the final would be
        transcriber.feed(audio[audio.size - SAMPLE_RATE // 2 :], decode=False)  # silence, no pass
        passes = transcriber.passes
        finals.append(transcriber.finish())
        assert transcriber.passes - passes == decodes_at_the_end
    assert word_errors(finals[1], finals[0])[0] == 0, finals


def test_the_context_primes_the_decoder_without_changing_a_clear_question(decoder: WhisperDecoder) -> None:
    transcriber = IncrementalTranscriber(
        decoder, IncrementalSettings(), context="We were talking about the solar system and its planets."
    )
    stream(transcriber, question("largest_planet"))
    assert word_errors(sample_text("largest_planet"), transcriber.finish())[0] == 0


def test_a_long_input_is_cut_into_segments_whose_text_adds_up(decoder: WhisperDecoder) -> None:
    one, two = question("capital_of_france"), question("days_in_a_week")
    transcriber = IncrementalTranscriber(decoder, IncrementalSettings(max_segment_s=one.size / SAMPLE_RATE))
    deltas = stream(transcriber, np.concatenate([one, two]))
    streamed = "".join(delta for _, delta in deltas)
    final = transcriber.finish()
    assert streamed.startswith(sample_text("capital_of_france")), streamed  # the first segment, finished
    assert final.startswith(streamed)
    reference = f"{sample_text('capital_of_france')} {sample_text('days_in_a_week')}"
    assert word_errors(reference, final)[0] == 0, final


def test_feed_after_finish_is_refused() -> None:
    # Whisper's double, scripted with no hypothesis: finishing with no audio decodes nothing
    transcriber = IncrementalTranscriber(ScriptedDecoder([]), IncrementalSettings())  # type: ignore[arg-type]
    assert transcriber.finish() == ""
    with pytest.raises(RuntimeError, match="feed after finish"):
        transcriber.feed(np.zeros(CHUNK, np.float32))


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"cadence_s": 0}, "cadence_s"),
        ({"beam_size": 0}, "beam_size"),
        ({"max_segment_s": 25.0}, "max_segment_s"),
        ({"window_padding_s": 30.0}, "window_padding_s"),
        ({"holdback_words": -1}, "holdback_words"),
        ({"agreement": 1}, "agreement"),
        ({"quiet_rms": -0.1}, "quiet_rms"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(arguments: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        IncrementalSettings(**arguments)  # type: ignore[arg-type]  # the bad values are the point


class ScriptedDecoder:
    """A test double for WhisperDecoder alone: each decode returns the next scripted
    hypothesis (words as tokens, one token per entry of ``VOCAB``) and records the prefix
    it was asked to force, so LocalAgreement and the forcing are checked exactly."""

    VOCAB = (" What", " is", " the", " my", " capital", " of", " France", "?")

    def __init__(self, hypotheses: list[str]) -> None:
        self.hypotheses = [[self.VOCAB.index(piece) for piece in hypothesis.split("|")] for hypothesis in hypotheses]
        self.prefixes: list[list[int]] = []

    def encode_text(self, text: str) -> list[int]:
        return []

    def text(self, tokens: list[int]) -> str:
        return "".join(self.VOCAB[t] for t in tokens).strip()

    def starts_word(self, token: int) -> bool:
        return self.VOCAB[token].startswith(" ")

    def decode(self, audio: np.ndarray, *, padding_s: float, beam_size: int, prompt: list[int], prefix: list[int]) -> list[int]:
        self.prefixes.append(list(prefix))
        tokens = self.hypotheses.pop(0)
        assert tokens[: len(prefix)] == prefix, "a scripted hypothesis must begin with the forced prefix"
        return tokens


def test_words_two_passes_agree_on_are_confirmed_and_forced_from_then_on() -> None:
    scripted = ScriptedDecoder(
        [
            " What| is| my",  # pass 1: nothing to agree with yet
            " What| is| the| capital",  # pass 2: "What is" agreed ("my"/"the" differ)
            " What| is| the| capital| of",  # pass 3: "the capital" agreed, "of" held back (newest)
            " What| is| the| capital| of| France|?",  # the final decode
        ]
    )
    settings = IncrementalSettings(cadence_s=0.1, quiet_rms=0.0)
    transcriber = IncrementalTranscriber(scripted, settings)  # type: ignore[arg-type]  # the test double
    silence = np.zeros(CHUNK, np.float32)
    deltas = [transcriber.feed(silence) for _ in range(3)]
    assert deltas == ["", "What is", " the capital"]
    final = transcriber.finish()
    assert final == "What is the capital of France?" and "".join(deltas) + final[len("What is the capital") :] == final
    what, is_, the, capital = (ScriptedDecoder.VOCAB.index(w) for w in (" What", " is", " the", " capital"))
    # the final decode is the whole segment's, unforced: it begins with the confirmed words
    assert scripted.prefixes == [[], [], [what, is_], []]


def test_a_final_decode_that_disagrees_with_the_confirmed_words_is_decoded_again_forced() -> None:
    scripted = ScriptedDecoder(
        [
            " What| is| my",
            " What| is| the",  # "What is" confirmed and streamed
            " What| the| capital",  # the whole decode at the end: not what was streamed
            " What| is| the| capital",  # so the tail after the confirmed words, forced
        ]
    )
    transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1, quiet_rms=0.0))  # type: ignore[arg-type]  # the test double
    assert [transcriber.feed(np.zeros(CHUNK, np.float32)) for _ in range(2)] == ["", "What is"]
    assert transcriber.finish() == "What is the capital" and transcriber.forced_finals == 1
    what, is_ = (ScriptedDecoder.VOCAB.index(w) for w in (" What", " is"))
    assert scripted.prefixes == [[], [], [], [what, is_]]


def test_agreement_3_waits_for_three_passes() -> None:
    scripted = ScriptedDecoder([" What| is| the"] * 3 + [" What| is| the| capital"])
    transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1, agreement=3, quiet_rms=0.0))  # type: ignore[arg-type]  # the test double
    deltas = [transcriber.feed(np.zeros(CHUNK, np.float32)) for _ in range(3)]
    assert deltas == ["", "", "What is"]  # "the" is the newest word of each pass: held back
    assert transcriber.finish() == "What is the capital"


def test_a_tentative_transcript_decodes_only_the_tail_and_the_final_is_it() -> None:
    """At a pause (issue 46) the answer asks for the transcript so far: the confirmed words are
    forced and only what follows them is decoded; when only silence came since, nothing is
    decoded at all, and the input then ending in silence leaves no decode either."""
    scripted = ScriptedDecoder(
        [
            " What| is| my",  # pass 1
            " What| is| the| capital",  # pass 2: "What is" confirmed
            " What| is| the| capital| of| France|?",  # the tentative decode at the pause
        ]
    )
    transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1))  # type: ignore[arg-type]  # the test double
    voiced = np.full(CHUNK, 0.2, np.float32)
    assert [transcriber.feed(voiced) for _ in range(2)] == ["", "What is"]
    transcriber.feed(voiced[: CHUNK // 2])  # under the cadence: no pass
    delta, so_far = transcriber.tentative()
    what, is_ = (ScriptedDecoder.VOCAB.index(w) for w in (" What", " is"))
    assert so_far == "What is the capital of France?" and scripted.prefixes[-1] == [what, is_]
    assert delta == " the capital"  # the tentative decode is a pass: two agree on "the capital"
    passes = transcriber.passes
    transcriber.feed(np.zeros(CHUNK // 2, np.float32))  # silence after it: under the cadence
    assert transcriber.tentative() == ("", so_far) and transcriber.passes == passes  # asked again: no decode
    assert transcriber.finish() == so_far and transcriber.passes == passes  # the end: none either
    assert transcriber.tentatives == 2


def test_a_tentative_transcript_after_speech_since_the_last_pass_decodes_once() -> None:
    scripted = ScriptedDecoder([" What| is", " What| is| the", " What| is| the| capital"])
    transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1))  # type: ignore[arg-type]  # the test double
    voiced = np.full(CHUNK, 0.2, np.float32)
    transcriber.feed(voiced)
    transcriber.feed(voiced)
    transcriber.feed(voiced[:10], decode=False)  # a little speech after the last pass: it must be heard
    assert transcriber.tentative()[1] == "What is the capital" and transcriber.passes == 3


def test_no_pass_is_made_over_silence_alone() -> None:
    """A pause, or the silence that ends a turn, is not decoded pass after pass (issue 46: the CPU
    a turn costs); speech after it is, with the silence."""
    scripted = ScriptedDecoder([" What| is", " What| is| the", " What| is| the| capital"])
    transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1))  # type: ignore[arg-type]  # the test double
    voiced, quiet = np.full(CHUNK, 0.2, np.float32), np.zeros(CHUNK, np.float32)
    transcriber.feed(voiced)
    transcriber.feed(voiced)
    assert transcriber.passes == 2
    for _ in range(5):
        transcriber.feed(quiet)
    assert transcriber.passes == 2  # half a second of silence: no pass
    transcriber.feed(voiced)
    assert transcriber.passes == 3 and scripted.hypotheses == []


def test_a_pass_that_heard_the_whole_question_is_the_tentative_transcript() -> None:
    """A pass made while audio arrived, at the final beam, that heard every voiced sample and
    150 ms of quiet after them (only silence since): the pause asks for the transcript and
    nothing is decoded again (issue 46: the tentative decode waited behind that pass, then
    repeated it); the input ending in silence gives the same transcript, the one the answer
    heard. A pass cut closer to the speech's end may have cut a word's fading tail: decoded
    again, as at a cheaper beam."""
    voiced, quiet = np.full(CHUNK, 0.2, np.float32), np.zeros(CHUNK, np.float32)
    end = np.concatenate([voiced[: CHUNK // 5], quiet, quiet[: CHUNK * 4 // 5]])  # 20 ms of speech, 180 ms quiet

    def asked(ending: np.ndarray, **settings: object) -> IncrementalTranscriber:
        scripted = ScriptedDecoder([" What| is", " What| is| the", " What| is| the| capital", " What| is| the| capital| of"])
        transcriber = IncrementalTranscriber(scripted, IncrementalSettings(cadence_s=0.1, **settings))  # type: ignore[arg-type]  # the test double
        for piece in (voiced, voiced, ending, quiet[: CHUNK // 2]):  # the question, its end (a pass), the pause
            transcriber.feed(piece)
        assert transcriber.passes == 3
        return transcriber

    heard = asked(end)
    assert heard.tentative() == ("", "What is the capital") and heard.passes == 3
    assert heard.finish() == "What is the capital" and heard.passes == 3
    cut = asked(np.concatenate([voiced[: CHUNK // 2], quiet[: CHUNK // 2]]))  # 50 ms of quiet after the speech
    assert cut.tentative()[1] == "What is the capital of" and cut.passes == 4
    cheap = asked(end, pass_beam_size=1)  # not what the final decode would be
    assert cheap.tentative()[1] == "What is the capital of" and cheap.passes == 4
