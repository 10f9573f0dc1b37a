"""Sentence splitting as text streams in, and Piper synthesis."""

from __future__ import annotations

import numpy as np
import pytest

from omnictl.models.voice_assistant.tts import PiperSpeaker, SentenceSplitter, fit_piece, ramp_chars, speakable


def feed_words(splitter: SentenceSplitter, text: str) -> list[str]:
    out: list[str] = []
    for word in text.split(" "):
        out += splitter.feed(word + " ")
    return out


def test_sentences_come_out_as_soon_as_they_end() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("The capital of France") == []
    assert splitter.feed(" is Paris. It has") == ["The capital of France is Paris."]
    assert splitter.pending == "It has"
    assert splitter.feed(" museums!\nAnd") == ["It has museums!"]
    assert splitter.flush() == ["And"]
    assert splitter.flush() == []


def test_a_sentence_ends_with_its_last_token_not_with_the_next_space() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("It is Paris.") == ["It is Paris."]
    assert splitter.feed(" Really?") == ["Really?"]
    assert splitter.feed(" It has 2.") == []  # may still become 2.5
    assert splitter.feed("5 million people. See Dr.") == ["It has 2.5 million people."]
    assert splitter.pending == "See Dr."


def test_the_first_piece_may_end_at_a_comma_once_it_is_long_enough() -> None:
    splitter = SentenceSplitter(first_clause_chars=20)
    assert splitter.feed("Yes, it is. ") == ["Yes, it is."]  # a short first sentence: no cut at its comma
    splitter = SentenceSplitter(first_clause_chars=20)
    assert splitter.feed("Short, then") == []
    assert splitter.feed(" the largest planet is Jupiter, which") == ["Short, then the largest planet is Jupiter,"]
    assert splitter.feed(" is big, and gassy.") == ["which is big, and gassy."]  # later pieces end at sentence ends only


def test_abbreviations_numbers_and_list_items_do_not_end_a_sentence() -> None:
    splitter = SentenceSplitter(first_clause_chars=None)
    text = "Dr. Smith lives at No. 5 St. James. It has 2.5 million people. Steps: 1. wake up 2. eat"
    assert feed_words(splitter, text) == ["Dr. Smith lives at No. 5 St. James.", "It has 2.5 million people.", "Steps:"]
    assert splitter.flush() == ["1. wake up 2. eat"]


def test_a_sentence_that_never_ends_is_cut_at_a_comma_or_space() -> None:
    splitter = SentenceSplitter(max_chars=40)
    sentences = feed_words(splitter, "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen")
    assert sentences and all(len(s) <= 40 for s in sentences)
    assert sentences[0].endswith(",")
    assert " ".join(sentences + splitter.flush()).split() == "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen".split()


def test_markup_is_not_spoken() -> None:
    assert speakable("**Paris** is `nice`") == "Paris is nice"
    assert speakable(" --- ") == ""
    assert speakable("### ") == ""


@pytest.fixture(scope="module")
def speaker() -> PiperSpeaker:
    return PiperSpeaker()


def test_piper_speaks_a_sentence(speaker: PiperSpeaker) -> None:
    audio = speaker.synthesize("The capital of France is Paris.")
    assert speaker.sample_rate == 22_050
    assert audio.dtype == np.float32 and audio.ndim == 1
    seconds = audio.size / speaker.sample_rate
    assert 1.0 < seconds < 5.0
    assert np.abs(audio).max() <= 1.0 and np.abs(audio).max() > 0.1  # not silence
    assert speaker.synthesize("**") .size == 0


def test_unknown_voice_is_named() -> None:
    with pytest.raises(ValueError, match="'alloy'.*joe"):
        PiperSpeaker("alloy")


def test_a_long_first_sentence_without_a_comma_is_cut_before_a_clause() -> None:
    text = ("The largest planet in our solar system is Jupiter which is mostly made of hydrogen "
            "and helium gas. It has many moons.")
    pieces = feed_words(SentenceSplitter(first_max_chars=80), text)
    assert pieces[0] == "The largest planet in our solar system is Jupiter"
    assert pieces[1:] == ["which is mostly made of hydrogen and helium gas.", "It has many moons."]
    # without a clause word it ends at the last whole word before the limit
    pieces = feed_words(SentenceSplitter(first_max_chars=40), "Honestly nobody really knows exactly how many grains exist here.")
    assert pieces[0] == "Honestly nobody really knows exactly"
    assert len(pieces[0]) <= 40
    # off: the first sentence waits for its end
    assert feed_words(SentenceSplitter(first_max_chars=None), text)[0] == text.split(". ")[0] + "."
    # a short first sentence is never cut
    assert feed_words(SentenceSplitter(), "Paris is the capital. Yes.") == ["Paris is the capital.", "Yes."]


LONG = ("They can be found in many parts of the world, including Hawaii and Iceland, "
        "where they shape the land and which people visit every year.")


def test_a_piece_is_sized_so_its_synthesis_fits_the_budget() -> None:
    # 10 ms of synthesis a character: 0.5 s pays for 50 characters, 1 s for 100
    assert ramp_chars(0.5, 0.010) == 50
    assert ramp_chars(1.0, 0.010) == 100
    # never under the floor (a listener already waiting, or no budget): one clause-sized piece
    assert ramp_chars(0.05, 0.010) == 30 and ramp_chars(-2.0, 0.010) == 30
    with pytest.raises(ValueError, match="synthesis_s_per_char"):
        ramp_chars(1.0, 0.0)


def test_a_long_sentence_is_cut_at_a_comma_then_a_clause_word_then_a_space() -> None:
    # 50 characters (0.5 s at 10 ms a character): the comma in the piece's second half
    assert fit_piece(LONG, ramp_chars(0.5, 0.010)) == (
        "They can be found in many parts of the world,",
        "including Hawaii and Iceland, where they shape the land and which people visit every year.")
    # 80: the later comma
    assert fit_piece(LONG, 80) == (
        "They can be found in many parts of the world, including Hawaii and Iceland,",
        "where they shape the land and which people visit every year.")
    # no comma in the piece's second half: before the last clause word there
    assert fit_piece("Honestly nobody really knows how many grains of sand exist because counting is hard.", 70) == (
        "Honestly nobody really knows how many grains of sand exist", "because counting is hard.")
    # clause words before the floor (30) do not count: the last space within the limit
    rest = fit_piece(LONG, 80)[1]
    assert fit_piece(rest, 40) == ("where they shape the land and which", "people visit every year.")
    # no comma and no clause word: the last space within the limit
    assert fit_piece("Honestly nobody really knows exactly how many grains of sand exist.", 40) == (
        "Honestly nobody really knows exactly how", "many grains of sand exist.")
    # under the floor: the piece ends after the word that crosses it
    assert fit_piece(LONG, 10) == ("They can be found in many parts", LONG[32:])
    # a sentence that fits, or whose rest would be a lone word, is not cut
    assert fit_piece(LONG, 200) == (LONG, "")
    assert fit_piece("Volcanoes are a natural phenomenon on Earth.", 40) == (
        "Volcanoes are a natural phenomenon on Earth.", "")


def test_the_whole_words_of_an_unfinished_sentence_can_be_taken_early() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("Bees are busy. They visit thousands of flo") == ["Bees are busy."]
    # fewer than 30 characters of whole words ("flo" may be a word still being written): nothing
    assert splitter.take_words() == ""
    assert splitter.pending == "They visit thousands of flo"
    splitter.feed("wers every single da")
    assert splitter.take_words() == "They visit thousands of flowers every single"
    assert splitter.pending == "da"
    assert splitter.feed("y. ") == ["day."]
