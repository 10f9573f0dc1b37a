"""Where a sentence ends: the one rule the thinker's sentence cap and the TTS splitter share.

A sentence ends at ``!`` or ``?``, at a ``.`` right after a letter (not "3." of "3.14"),
each with any closing quotes or brackets after it, when whitespace or the end of the text
follows; and at each line break. A dot after an abbreviation ("Mr.", "Dr.", "e.g."), an
initial ("J.") or a list number ("1.") continues the sentence (:func:`dot_continues`).

:class:`SentenceCounter` counts the sentences an answer has ended as its text arrives, a
piece at a time, with work per piece that does not grow with the answer; the sentence cap
(``max_sentences``) stops the answer on its count. The TTS splitter
(:class:`~omnictl.models.voice_assistant.tts.SentenceSplitter`) cuts a piece of speech at
the same ends, and also at ``;`` and ``:`` (a pause, so that speech can start sooner).
"""

from __future__ import annotations

import re

# What may close a sentence after its mark: quotes and brackets.
CLOSERS = "\"'”’)\\]"
# Words whose trailing dot does not end a sentence.
ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "approx", "no", "jr", "sr"}
)
# The end of a word (text between whitespace) that ends a sentence, when whitespace or the end follows.
_WORD_END = re.compile(rf"(?:(?<=[^\W\d_])[.!?]|[!?])[{CLOSERS}]*$")
_SPACE = re.compile(r"(\s+)")
# Enough of the text before a dot to hold the word it ends (no abbreviation is longer).
_WORD_REACH = 32


def dot_continues(before_dot: str) -> bool:
    """Whether a ``.`` after ``before_dot`` continues the sentence: after an abbreviation
    ("Dr."), "e.g.", an initial ("J."), a list number ("1."), or nothing at all."""
    words = before_dot[-_WORD_REACH:].split()
    if not words:
        return True
    last = words[-1].lower().lstrip("(\"'")
    return last in ABBREVIATIONS or len(last) == 1 or last.isdigit()


def word_ends_sentence(word: str) -> bool:
    """Whether ``word`` (no whitespace in it) ends a sentence if whitespace or the end follows."""
    match = _WORD_END.search(word)
    if match is None:
        return False
    return not (match.group().startswith(".") and dot_continues(word[: match.start()]))


class SentenceCounter:
    """How many sentences a text has ended so far, fed a piece at a time.

    ``feed`` returns the count for the whole text fed so far; a last word that ends a
    sentence counts already ("Paris." ends one before the next token brings the space), and
    stops counting if the text then continues it ("Paris.com"). Leading whitespace is no
    line break of the answer. Only the word still being written is kept, so a piece costs
    its own length (and that word's)."""

    def __init__(self) -> None:
        self._ended = 0  # by words that whitespace closed, and by line breaks
        self._word = ""  # the word still being written
        self._started = False  # leading whitespace is skipped

    def feed(self, piece: str) -> int:
        text = self._word + piece
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        parts = _SPACE.split(text)  # word, space, word, …, the last word ("" after a space)
        for index in range(0, len(parts) - 1, 2):
            self._ended += word_ends_sentence(parts[index]) + parts[index + 1].count("\n")
        self._word = parts[-1]
        return self._ended + word_ends_sentence(self._word)


def sentences_ended(text: str) -> int:
    """How many sentences ``text`` (an answer so far) has ended."""
    return SentenceCounter().feed(text)
