"""End of turn: ``server_vad`` (silence only) against ``semantic_vad`` (Smart Turn v3.2), side by side.

Both detectors are the session's own (``omnictl.serving.realtime``), fed the same audio in
100 ms appends, Silero VAD under both, with the turn model called where the session calls
it (in line: its time counts). The questions are the packaged sample questions (Piper,
``omnictl/data/samples``), deterministic audio:

- **paused**: each question with a pause inserted mid-sentence (``--pause-ms`` of silence
  at the quiet gap between words nearest its middle), as a speaker who stops to think.
  A detector that ends the turn at the pause cuts the question in two. Goal: ``server_vad``
  cuts them (that is the problem), ``semantic_vad`` keeps each one turn.
- **plain**: each question as spoken. Measured: from the end of speech (where the question's
  audio ends) to the moment the detector ends the turn, in audio time plus the turn model's
  compute; the session commits and starts the response at that moment. Goal:
  ``semantic_vad`` (eagerness ``auto``) no slower than ``server_vad`` at ``--silence-ms``.

Run: ``python benchmarks/realtime_turn_detection.py [--silence-ms 500] [--pause-ms 900]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks.eval.samples

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

SAMPLES = ("capital_of_france", "days_in_a_week", "largest_planet", "sky_colour", "spider_legs")
CHUNK = PCM16_RATE // 10  # 100 ms appends


def question(name: str) -> np.ndarray:
    samples, rate = sample_question(name)
    return resample(samples.astype(np.float32), rate, PCM16_RATE)


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
    parser.add_argument("--silence-ms", type=int, default=500, help="server_vad's silence_duration_ms")
    parser.add_argument("--pause-ms", type=int, default=900, help="the pause inserted mid-question")
    args = parser.parse_args()
    silero, smart = SileroModel(), SmartTurnModel()
    lead, tail = np.zeros(PCM16_RATE // 2, np.float32), np.zeros(PCM16_RATE * 9, np.float32)
    detectors = {
        "server_vad": lambda: TurnDetector(VadSettings(silence_duration_ms=args.silence_ms)),
        **{f"semantic_vad {e}": (lambda e=e: SemanticTurnDetector(smart, e)) for e in ("high", "auto", "low")},
    }
    print(f"paused questions ({args.pause_ms} ms pause mid-sentence): turns the detector made of each (1 is right)")
    split: dict[str, int] = {}
    for name, make in detectors.items():
        counts = [len(run(make(), silero, np.concatenate([lead, with_pause(question(q), args.pause_ms), tail]))[0]) for q in SAMPLES]
        split[name] = sum(c > 1 for c in counts)
        print(f"  {name:<20} turns {counts}  cut early: {split[name]}/{len(SAMPLES)}")
    print("plain questions: end of speech -> end of turn (audio ms after the speech ended + turn-model compute)")
    waits: dict[str, float] = {}
    for name, make in detectors.items():
        per, computes = [], []
        for q in SAMPLES:
            audio = question(q)
            voiced_end = (np.nonzero(np.abs(audio) > 0.02)[0][-1] + lead.size) / PCM16_RATE * 1000
            ends, compute = run(make(), silero, np.concatenate([lead, audio, tail]))
            per.append(ends[0] - voiced_end + compute if ends else float("nan"))
            computes.append(compute)
        waits[name] = statistics.median(per)
        print(f"  {name:<20} median {waits[name]:6.0f} ms (of which turn model {statistics.median(computes):4.0f} ms)"
              f"   per question {[round(w) for w in per]}")
    for e in ("high", "auto", "low"):
        check, cap, sure = EAGERNESS[e]
        print(f"(semantic_vad {e}: the turn model asked after {check} ms of silence, finished from p >= {sure}, cap {cap} ms)")
    paused_met = split["server_vad"] > 0 and split["semantic_vad auto"] == 0
    faster_met = waits["semantic_vad auto"] <= waits["server_vad"]
    eager_met = waits["semantic_vad high"] < waits["semantic_vad low"]
    print(f"server_vad cuts paused questions, semantic_vad (auto) keeps them whole: {'met' if paused_met else 'not met'}")
    print(f"semantic_vad (auto) end of turn no slower than server_vad at {args.silence_ms} ms: "
          f"{waits['semantic_vad auto']:.0f} vs {waits['server_vad']:.0f} ms: {'met' if faster_met else 'not met'}")
    print(f"eagerness changes the wait (high {waits['semantic_vad high']:.0f} < low {waits['semantic_vad low']:.0f} ms): "
          f"{'met' if eager_met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
