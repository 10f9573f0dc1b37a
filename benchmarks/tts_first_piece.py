"""First audio and gaps of the voice assistant's TTS: a short first clause against a whole first sentence.

The TTS stage speaks the answer piece by piece as it streams in, so first audio waits for
the first piece to be written (at the LLM's pace) and then synthesised whole by Piper.
Side by side, answer by answer, in one run: the real TTS scheduler
(:class:`~omnictl.models.voice_assistant.speech_scheduler.SentenceSpeechScheduler`, its
``fifo`` policy, the real Piper voice) fed the answer a word at a time at ``--words-per-s``:

- **sentence**: ``first_words=None``, the first piece a whole sentence (or cut at a comma
  past 40 characters, or at 60), later pieces whole sentences: as before the short clause;
- **clause**: the default, a first clause of three to five words, later pieces ending at
  commas too, and the words written so far when the listener is about to run dry.

Per answer: time to first audio (from the first word; the median of ``--rounds``), the
largest underrun a listener playing each chunk as it leaves the stage would hear (the
playback clock of :mod:`omnictl.playback.continuity`), and whether the pieces' transcripts
joined are the answer (the audio says the same words).

Goals (printed met / not met): the clause's median first audio at least 40 % sooner than
the sentence's; its largest underrun at most 50 ms on every answer; every answer's pieces
say its words. Timings are wall-clock: on a busy machine Piper and the word clock slow down.

Run: ``python benchmarks/tts_first_piece.py [--words-per-s 12] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnictl.models.voice_assistant.speech_scheduler import SentenceSpeechScheduler
from omnictl.models.voice_assistant.tts import FIRST_WORDS, PiperSpeaker
from omnictl.outputs import TokenDelta, TokenResult
from omnictl.playback.continuity import PlaybackClock
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind

# What the embedded thinker answers (one short sentence), and longer first sentences.
ANSWERS = [
    "The capital of France is Paris.",
    "The largest planet in our solar system is Jupiter.",
    "Spiders have eight legs, which they use to walk and to spin their webs.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The Great Wall of China was built over many centuries by several dynasties to protect their lands from raids.",
    "Photosynthesis is the process plants use to turn sunlight, water and carbon dioxide into sugar and oxygen.",
    "I'm sorry, but I don't know the answer to that question.",
    "The largest planet in our solar system is Jupiter which is a gas giant made mostly of hydrogen and helium. It has dozens of moons.",
]
CONFIGS = {"sentence": None, "clause": FIRST_WORDS}
GOAL_SOONER = 0.40
GOAL_UNDERRUN_S = 0.05


async def speak(speaker: PiperSpeaker, answer: str, first_words: tuple[int, int] | None, words_per_s: float) -> tuple[float, float, list[str]]:
    """(first audio s, largest underrun s, the pieces' transcripts) of one answer streamed word by word."""
    scheduler = SentenceSpeechScheduler(speaker_factory=lambda voice: speaker, first_words=first_words)
    await scheduler.start()
    try:
        started = time.monotonic()
        clock = PlaybackClock(started)
        pieces: list[str] = []

        async def listen() -> None:
            while True:
                message = await asyncio.wait_for(scheduler.outbox.get(), 60)
                if message.kind is not OutgoingKind.STREAM:
                    if message.kind is not OutgoingKind.RESULT:
                        raise RuntimeError(f"the TTS failed: {message}")
                    return
                clock.chunk(time.monotonic(), message.data.samples.size / message.data.sample_rate)
                pieces.append(message.data.transcript)

        listener = asyncio.create_task(listen())
        for index, word in enumerate(answer.split(" ")):
            # on the word clock, not after a sleep: the time the scheduler takes is not added
            await asyncio.sleep(max(0.0, started + index / words_per_s - time.monotonic()))
            scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_CHUNK, "r", data=TokenDelta(text=word + " ", token_ids=[1]), source="thinker"))
        scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.NEW_REQUEST, "r", data=TokenResult(text=answer), source="thinker"))
        await listener
        report = clock.report()
        return report.ttfp_s or float("nan"), report.largest_underrun_s, pieces
    finally:
        await scheduler.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--words-per-s", type=float, default=12.0, help="the LLM's pace (SmolLM2 on 2 busy CPU cores: ~12)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    speaker = PiperSpeaker()
    speaker.synthesize("Warm up.")
    firsts: dict[str, list[float]] = {name: [] for name in CONFIGS}
    worst: dict[str, float] = dict.fromkeys(CONFIGS, 0.0)
    same_words = True
    print(f"{'answer':<44} {'sentence ms':>12} {'clause ms':>10} {'gap ms (s/c)':>13}  first piece (clause)")
    for answer in ANSWERS:
        row: dict[str, tuple[float, float, list[str]]] = {}
        for name, first_words in CONFIGS.items():
            runs = [asyncio.run(speak(speaker, answer, first_words, args.words_per_s)) for _ in range(args.rounds)]
            first = statistics.median(r[0] for r in runs)
            largest = max(r[1] for r in runs)
            same_words &= all(" ".join(r[2]) == answer for r in runs)
            firsts[name].append(first)
            worst[name] = max(worst[name], largest)
            row[name] = (first, largest, runs[0][2])
        (s_first, s_gap, _), (c_first, c_gap, c_pieces) = row["sentence"], row["clause"]
        print(f"{answer[:42] + '..':<44} {s_first * 1000:>12.0f} {c_first * 1000:>10.0f} {s_gap * 1000:>6.0f}/{c_gap * 1000:<6.0f}  {c_pieces[0]!r}")
    sentence, clause = statistics.median(firsts["sentence"]), statistics.median(firsts["clause"])
    sooner = 1 - clause / sentence
    print(f"median first audio: sentence {sentence * 1000:.0f} ms, clause {clause * 1000:.0f} ms ({sooner:.0%} sooner); "
          f"largest underrun: sentence {worst['sentence'] * 1000:.0f} ms, clause {worst['clause'] * 1000:.0f} ms "
          f"(words at {args.words_per_s:g}/s)")
    goals = [
        (f"clause: median first audio >= {GOAL_SOONER:.0%} sooner than a whole first sentence", sooner >= GOAL_SOONER),
        (f"clause: largest underrun <= {GOAL_UNDERRUN_S * 1000:.0f} ms on every answer", worst["clause"] <= GOAL_UNDERRUN_S),
        ("every answer's pieces joined are its words", same_words),
    ]
    for text, met in goals:
        print(f"goal {text}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
