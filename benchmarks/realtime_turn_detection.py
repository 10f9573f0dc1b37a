"""End of turn: ``server_vad`` (silence only) against ``semantic_vad`` (Smart Turn v3.2), side by side.

Every detector is the session's own (``omnictl.serving.realtime``), fed the same audio in
100 ms appends, Silero VAD under each, with the turn model called where the session calls
it (in line: its time counts). The questions are the answer-quality eval set's
(``benchmarks/eval/quality.py``: 45 short questions), spoken by the Piper voice (and, with
``--voices all``, three espeak-ng voices), deterministic audio:

- **paused**: each question with a pause inserted mid-sentence (``--pause-ms`` of silence,
  600 ms by default, at the last quiet gap between words at least 250 ms before the end),
  as a speaker who stops to find the last word: "What is the capital of ... Germany?". A
  detector that ends the turn at the pause cuts the question in two (a false cut-off: the
  answer would begin before the question ends). Goal: at most 10 % cut (LiveKit's turn
  detector, the best published: 9.9 % on its own benchmark).
- **plain**: each question as spoken. Measured: from the end of speech (where the question's
  audio ends) to the moment the detector ends the turn, in audio time plus the turn model's
  compute; the session commits and starts the response at that moment.

The detector with the shortest median wait among those within the cut-off goal is the one
the server should use by default; the script names it.

Run: ``python benchmarks/realtime_turn_detection.py [--silence-ms 500,700,800] [--pause-ms 600] [--voices piper|all]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks.eval

from benchmarks.eval.quality import QUESTIONS, SAMPLE_RATE, VOICES, SpeechMaker  # noqa: E402
from benchmarks.eval.samples import sample_question  # noqa: E402
from omnictl.inputs import PCM16_RATE, resample  # noqa: E402
from omnictl.serving.realtime.smart_turn import EAGERNESS, SemanticTurnDetector, SmartTurnModel  # noqa: E402
from omnictl.serving.realtime.vad import (  # noqa: E402
    VAD_RATE,
    SileroModel,
    SileroVad,
    SpeechStopped,
    TurnDetector,
    VadSettings,
    to_vad_rate,
)

CHUNK = PCM16_RATE // 10  # 100 ms appends
CUT_OFF_GOAL = 0.10  # the share of paused questions a detector may cut


def question(name: str) -> np.ndarray:
    """A packaged sample question (``omnictl/data/samples``) as float32 mono at 24 kHz."""
    samples, rate = sample_question(name)
    return resample(samples.astype(np.float32), rate, PCM16_RATE)


def clips(voices: str, audio_dir: Path, limit: int) -> list[tuple[str, np.ndarray]]:
    """(label, float32 mono at 24 kHz) for each eval question in each voice asked for."""
    speech = SpeechMaker(audio_dir)
    chosen = [v for v in VOICES if voices == "all" or v.engine == "piper"]
    return [
        (f"{voice.name}: {q.text}", resample(speech.speak(q.text, voice), SAMPLE_RATE, PCM16_RATE))
        for voice in chosen
        for q in QUESTIONS[:limit]
    ]


def with_pause(audio: np.ndarray, pause_ms: int) -> np.ndarray:
    """``audio`` with ``pause_ms`` of silence inserted before its last word (at the last quiet
    gap between words at least 250 ms before the end of speech): "What is the capital of ...
    France?", a speaker searching for the word."""
    voiced = np.nonzero(np.abs(audio) > 0.02)[0]
    start, end = int(voiced[0]), int(voiced[-1])
    energy = np.convolve(audio**2, np.ones(480) / 480, "same")  # 20 ms
    quiet = np.nonzero(energy[start + PCM16_RATE // 4 : end - PCM16_RATE // 4] < 1e-4)[0] + start + PCM16_RATE // 4
    cut = int(quiet[-1]) if quiet.size else (start + end) // 2
    return np.concatenate([audio[:cut], np.zeros(PCM16_RATE * pause_ms // 1000, np.float32), audio[cut:]])


def run(detector: TurnDetector | SemanticTurnDetector, silero: SileroModel, audio: np.ndarray) -> tuple[list[int], float]:
    """(every turn end, in ms of audio; the turn model's compute, in ms)."""
    vad = SileroVad(silero, VAD_RATE)
    ends, compute = [], 0.0
    for start in range(0, audio.size, CHUNK):
        chunk = to_vad_rate(audio[start : start + CHUNK], PCM16_RATE)
        probabilities = vad.feed(chunk)
        began = time.perf_counter()
        found = detector.feed(probabilities, chunk) if isinstance(detector, SemanticTurnDetector) else detector.feed(probabilities)
        compute += (time.perf_counter() - began) * 1000
        for event in found:
            if isinstance(event, SpeechStopped):
                decided_ms = (detector.frames * detector.frame_ms)  # the frame at which the turn ended
                ends.append(int(decided_ms))
    return ends, compute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silence-ms", default="500,700,800", help="server_vad's silence_duration_ms (a list: one detector each)")
    parser.add_argument("--pause-ms", type=int, default=600, help="the pause inserted mid-question")
    parser.add_argument("--voices", choices=("piper", "all"), default="piper")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="the first N eval questions")
    parser.add_argument("--audio-dir", type=Path, help="cache spoken clips here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        questions = clips(args.voices, args.audio_dir or Path(scratch), args.questions)
    silero, smart = SileroModel(), SmartTurnModel()
    lead, tail = np.zeros(PCM16_RATE // 2, np.float32), np.zeros(PCM16_RATE * 9, np.float32)
    detectors: dict[str, Callable[[], TurnDetector | SemanticTurnDetector]] = {
        **{
            f"server_vad {ms} ms": (lambda ms=ms: TurnDetector(VadSettings(silence_duration_ms=ms)))
            for ms in (int(value) for value in args.silence_ms.split(","))
        },
        **{f"semantic_vad {e}": (lambda e=e: SemanticTurnDetector(smart, e)) for e in ("high", "auto", "low")},
    }
    n = len(questions)
    print(f"{n} questions ({args.voices}); paused: {args.pause_ms} ms of silence inserted mid-sentence")
    cut: dict[str, float] = {}
    for name, make in detectors.items():
        counts = [len(run(make(), silero, np.concatenate([lead, with_pause(a, args.pause_ms), tail]))[0]) for _, a in questions]
        cut[name] = sum(c > 1 for c in counts) / n
        missed = sum(c == 0 for c in counts)
        print(f"  {name:<22} cut early: {sum(c > 1 for c in counts):>3}/{n} ({cut[name]:.0%})"
              + (f"  (no turn end heard in {missed})" if missed else ""))
    print("plain questions: end of speech -> end of turn (audio ms after the speech ended + turn-model compute)")
    waits: dict[str, float] = {}
    for name, make in detectors.items():
        per, computes = [], []
        for _, audio in questions:
            voiced_end = (np.nonzero(np.abs(audio) > 0.02)[0][-1] + lead.size) / PCM16_RATE * 1000
            ends, compute = run(make(), silero, np.concatenate([lead, audio, tail]))
            per.append(ends[0] - voiced_end + compute if ends else float("nan"))
            computes.append(compute)
        waits[name] = statistics.median(per)
        print(f"  {name:<22} median {waits[name]:6.0f} ms, p90 {np.percentile(per, 90):6.0f} ms "
              f"(turn model {statistics.median(computes):4.0f} ms a question)")
    for e in ("high", "auto", "low"):
        check, cap, sure = EAGERNESS[e]
        print(f"(semantic_vad {e}: the turn model asked after {check} ms of silence, finished from p >= {sure}, cap {cap} ms)")
    for name in detectors:
        verdict = "met" if cut[name] <= CUT_OFF_GOAL else "not met"
        print(f"false cut-offs <= {CUT_OFF_GOAL:.0%}, {name}: {cut[name]:.0%}: {verdict}")
    within = [name for name in detectors if cut[name] <= CUT_OFF_GOAL]
    if within:
        best = min(within, key=lambda name: waits[name])
        print(f"default turn detection: {best} (the shortest median wait, {waits[best]:.0f} ms, within the cut-off goal)")
    else:
        print("default turn detection: none of these keeps false cut-offs within the goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
