"""Sentence splitting as text streams in, and Piper synthesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    # the coarser rule from before the first clause of a few words (first_words)
    splitter = SentenceSplitter(first_clause_chars=20, first_words=None)
    assert splitter.feed("Yes, it is. ") == ["Yes, it is."]  # a short first sentence: no cut at its comma
    splitter = SentenceSplitter(first_clause_chars=20, first_words=None)
    assert splitter.feed("Short, then") == []
    assert splitter.feed(" the largest planet is Jupiter, which") == ["Short, then the largest planet is Jupiter,"]
    assert splitter.feed(" is big, and gassy.") == ["which is big, and gassy."]  # later pieces end at sentence ends only


def test_abbreviations_numbers_and_list_items_do_not_end_a_sentence() -> None:
    splitter = SentenceSplitter(first_clause_chars=None, first_words=None)
    text = "Dr. Smith lives at No. 5 St. James. It has 2.5 million people. Steps: 1. wake up 2. eat"
    assert feed_words(splitter, text) == ["Dr. Smith lives at No. 5 St. James.", "It has 2.5 million people.", "Steps:"]
    assert splitter.flush() == ["1. wake up 2. eat"]


def test_a_sentence_that_never_ends_is_cut_at_a_comma_or_space() -> None:
    splitter = SentenceSplitter(max_chars=40, first_words=None, clause_chars=None)
    sentences = feed_words(splitter, "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen")
    assert sentences and all(len(s) <= 40 for s in sentences)
    assert sentences[0].endswith(",")
    assert " ".join(sentences + splitter.flush()).split() == "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen".split()


def test_markup_is_not_spoken() -> None:
    assert speakable("**Paris** is `nice`") == "Paris is nice"
    assert speakable(" --- ") == ""
    assert speakable("### ") == ""


@pytest.fixture
def speaker(piper: PiperSpeaker) -> PiperSpeaker:
    return piper  # the package's one Piper (conftest.py)


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
    pieces = feed_words(SentenceSplitter(first_max_chars=80, first_words=None), text)
    assert pieces[0] == "The largest planet in our solar system is Jupiter"
    assert pieces[1:] == ["which is mostly made of hydrogen and helium gas.", "It has many moons."]
    # without a clause word it ends at the last whole word before the limit
    pieces = feed_words(SentenceSplitter(first_max_chars=40, first_words=None), "Honestly nobody really knows exactly how many grains exist here.")
    assert pieces[0] == "Honestly nobody really knows exactly"
    assert len(pieces[0]) <= 40
    # off: the first sentence waits for its end
    assert feed_words(SentenceSplitter(first_max_chars=None, first_words=None), text)[0] == text.split(". ")[0] + "."
    # a short first sentence is never cut
    assert feed_words(SentenceSplitter(), "Paris is the capital. Yes.") == ["Paris is the capital.", "Yes."]


# answer -> its first piece: a clause of three to five words, handed out as soon as the word
# after it is whole (the splitter cannot tell "in" from "inside" before the space)
FIRST_CLAUSES = {
    "The capital of France is Paris, a city known for the Eiffel Tower.": "The capital of France",
    "The largest planet in our solar system is Jupiter.": "The largest planet",
    "The Great Wall of China was built over many centuries by several dynasties.": "The Great Wall of China",
    "I'm sorry, but I don't know the answer to that question.": "I'm sorry,",
    "I don't really know much about the topic at all.": "I don't really know much",
    "Photosynthesis is the process plants use to turn sunlight into sugar.": "Photosynthesis is the process plants",
    # no break word within five words: at five, or the latest end that leaves no article hanging
    "Honestly nobody really knows exactly how many grains exist.": "Honestly nobody really knows exactly",
    "Honestly nobody ever saw the big red fox there.": "Honestly nobody ever saw",
    # a sentence of a few words is one piece, however it is cut
    "Paris is the capital.": "Paris is the capital.",
    "Yes, it is.": "Yes, it is.",
    "Hello! How can I help you today?": "Hello!",
}


@pytest.mark.parametrize(("answer", "first"), FIRST_CLAUSES.items())
def test_the_first_piece_is_a_clause_of_a_few_words(answer: str, first: str) -> None:
    splitter = SentenceSplitter()
    pieces: list[str] = []
    for index, word in enumerate(answer.split(" ")):  # noqa: B007  (read after the loop)
        pieces += splitter.feed(word + " ")
        if pieces:
            break
    pieces += splitter.flush() if not pieces else []
    assert pieces[0] == first
    assert 1 <= len(first.split()) <= 5
    # handed out no later than the word after it, or after the fifth: speech starts while
    # the thinker writes on
    assert index <= max(len(first.split()), 5)


def test_the_first_clause_waits_for_the_word_after_it_to_be_whole() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("The capital of France i") == []  # "i" may become "inside"
    assert splitter.feed("s") == []
    assert splitter.feed(" Paris") == ["The capital of France"]
    assert splitter.pending == "is Paris"


def test_later_pieces_end_at_a_comma_once_they_are_a_clause_long() -> None:
    text = ("The capital of France is Paris, a city on the river Seine, which is famous for its "
            "museums, its food and the Eiffel Tower. It is old.")
    pieces = feed_words(SentenceSplitter(), text) + []
    assert pieces == ["The capital of France", "is Paris, a city on the river Seine,",
                      "which is famous for its museums,", "its food and the Eiffel Tower.", "It is old."]
    # off: a later piece waits for its sentence's end
    assert feed_words(SentenceSplitter(clause_chars=None), text)[1] == "is Paris, a city on the river Seine, " \
        "which is famous for its museums, its food and the Eiffel Tower."


_ANSWER_WORDS = st.sampled_from(["Paris", "is", "the", "of", "a", "capital,", "France.", "big!", "and", "which",
                                 "in", "2.5", "Dr.", "hello", "why?", "very", "don't", "Jupiter;"])


@settings(max_examples=200, deadline=None)
@given(words=st.lists(_ANSWER_WORDS, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_the_pieces_say_the_whole_answer_in_order(words: list[str], cuts: list[int]) -> None:
    """However the text is streamed (token boundaries anywhere), the pieces spoken are the
    answer's words, each once, in order: the audio says the same words as the text."""
    text = " ".join(words)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    splitter = SentenceSplitter()
    pieces: list[str] = []
    for start, end in zip(bounds, bounds[1:]):
        pieces += splitter.feed(text[start:end])
    pieces += splitter.flush()
    assert " ".join(pieces).split() == text.split()
    assert all(piece == piece.strip() and piece for piece in pieces)


def test_first_words_must_be_an_ordered_pair() -> None:
    with pytest.raises(ValueError, match="first_words"):
        SentenceSplitter(first_words=(4, 2))


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
