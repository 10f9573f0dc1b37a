"""First audio of the voice assistant's TTS with a long first sentence: cut or whole.

The TTS stage speaks sentence by sentence as the answer streams in, so its first audio
waits for the first piece to be written (at the LLM's pace) and then synthesised whole by
Piper. A long first sentence without a comma used to be one piece; the splitter now ends
the first piece before a clause word (or a space) once it reaches ``first_max_chars``.

Side by side, per answer, in one run with the real Piper voice: the text streamed word by
word at ``--words-per-s`` (the LLM's pace); time to first audio = when the splitter hands
out the first piece + Piper's time to synthesise it (the median of ``--rounds``).

Goal (printed): the first audio of every long-first-sentence answer comes sooner, their
median by at least 25 %, and no answer with a short first sentence gets later.

Run: ``python benchmarks/tts_first_piece.py [--words-per-s 12] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.models.voice_assistant.tts import PiperSpeaker, SentenceSplitter

LONG = [
    "The largest planet in our solar system is Jupiter which is a gas giant made mostly of hydrogen and helium. It has dozens of moons.",
    "Water boils at one hundred degrees Celsius at sea level because the vapour pressure equals the air pressure there. Higher up it boils sooner.",
    "The Great Wall of China was built over many centuries by several dynasties to protect their lands from raids. It is very long.",
    "Photosynthesis is the process plants use to turn sunlight water and carbon dioxide into sugar and oxygen for their growth. It happens in leaves.",
]
SHORT = ["Paris is the capital of France. It is known for the Eiffel Tower.", "Yes. The moon orbits the Earth about once a month."]


def first_piece(text: str, splitter: SentenceSplitter, words_per_s: float) -> tuple[str, float]:
    """The first piece the splitter hands out and when (seconds after the first word)."""
    words = text.split(" ")
    for index, word in enumerate(words):
        pieces = splitter.feed(word + " ")
        if pieces:
            return pieces[0], (index + 1) / words_per_s
    return splitter.flush()[0], len(words) / words_per_s


_SYNTHESIS: dict[str, float] = {}  # an identical piece is timed once: both columns share its noise


def synthesis_s(speaker: PiperSpeaker, piece: str, rounds: int) -> float:
    if piece in _SYNTHESIS:
        return _SYNTHESIS[piece]
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        speaker.synthesize(piece)
        times.append(time.perf_counter() - started)
    _SYNTHESIS[piece] = statistics.median(times)
    return _SYNTHESIS[piece]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--words-per-s", type=float, default=12.0, help="the LLM's pace (SmolLM2 on 2 CPU cores: ~12)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    speaker = PiperSpeaker()
    speaker.synthesize("Warm up.")
    print(f"{'answer':<44} {'whole ms':>9} {'cut ms':>8}  first piece (cut)")
    results: dict[str, list[tuple[float, float]]] = {"long": [], "short": []}
    for kind, answers in (("long", LONG), ("short", SHORT)):
        for text in answers:
            figures = []
            for splitter in (SentenceSplitter(first_max_chars=None), SentenceSplitter()):
                piece, ready = first_piece(text, splitter, args.words_per_s)
                figures.append((ready + synthesis_s(speaker, piece, args.rounds), piece))
            (whole, _), (cut, piece) = figures
            results[kind].append((whole, cut))
            print(f"{text[:42] + '..':<44} {whole * 1000:>9.0f} {cut * 1000:>8.0f}  {piece!r}")
    long_whole = statistics.median(w for w, _ in results["long"])
    long_cut = statistics.median(c for _, c in results["long"])
    drop = 1 - long_cut / long_whole
    print(f"long first sentences: median first audio {long_whole * 1000:.0f} ms whole, {long_cut * 1000:.0f} ms cut ({drop:.0%} sooner)")
    goals = [
        ("long first sentence: every one sooner, the median >= 25% sooner",
         drop >= 0.25 and all(c < w for w, c in results["long"])),
        ("short first sentence: never later", all(c <= w for w, c in results["short"])),
    ]
    for text, met in goals:
        print(f"goal {text}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
