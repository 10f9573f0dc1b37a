"""Transcribe while the user speaks: incremental ASR against today's whole-utterance decode.

Speaks the eval set's questions (:data:`benchmarks.eval.quality.QUESTIONS` in its
:data:`~benchmarks.eval.quality.VOICES`) and the held-out ones in voices no setting was
tuned on (:mod:`benchmarks.eval.heldout`); the audio is made at run time. Each clip is fed
in 100 ms chunks, at real time (``--speed 1``) or faster, to the ``asr_stream`` stage's
scheduler (``StreamingAsrScheduler``, in this process, driven as a Stage drives it), once
per ``--cadences`` value; side by side, the same clip is decoded whole, as the voice
assistant's ``asr`` stage does today once the turn has ended (its settings read from
``voice-assistant.yaml``).

Prints, per set and setting: WER, the tail latency (from the last chunk to the final
transcript: for the whole decode, the decode itself), how much of the transcript had
streamed before the input ended, and CPU seconds per second of audio; then each goal as met
/ not met: incremental WER <= whole WER on both sets, tail p50 <= 150 ms.

Run: ``python benchmarks/asr_incremental.py [--questions 42] [--heldout 32] [--cadences 0.4] [--speed 1] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

if __package__ in (None, ""):  # run as a script: benchmarks.* (the evaluation data) imports from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eval.heldout import HELDOUT_QUESTIONS, HELDOUT_VOICES
from benchmarks.eval.quality import QUESTIONS, VOICES, Question, SpeechMaker, Voice, word_errors
from omnictl.data import data_path
from omnictl.models.voice_assistant.asr import SAMPLE_RATE, SpeechRecognizer
from omnictl.models.voice_assistant.asr_stream import StreamingAsrScheduler
from omnictl.models.voice_assistant.incremental_asr import IncrementalSettings, WhisperDecoder
from omnictl.outputs import AudioChunk, Transcript
from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind

CHUNK = SAMPLE_RATE // 10  # 100 ms
TAIL_GOAL_S = 0.150


@dataclass
class Row:
    clip_set: str
    setting: str
    clips: int = 0
    edits: int = 0
    words: int = 0
    tails: list[float] = field(default_factory=list)
    streamed_before_end: list[float] = field(default_factory=list)  # share of the final text's characters
    cpu_s: float = 0.0
    audio_s: float = 0.0

    @property
    def wer(self) -> float:
        return self.edits / max(1, self.words)

    def tail(self, q: float) -> float:
        ordered = sorted(self.tails)
        return ordered[int(q * (len(ordered) - 1))] if ordered else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "set": self.clip_set,
            "setting": self.setting,
            "clips": self.clips,
            "wer": self.wer,
            "tail_p50_s": self.tail(0.5),
            "tail_p90_s": self.tail(0.9),
            "streamed_before_end": statistics.mean(self.streamed_before_end) if self.streamed_before_end else 0.0,
            "cpu_per_audio_s": self.cpu_s / max(1e-9, self.audio_s),
        }


def asr_settings() -> dict[str, Any]:
    """The voice assistant's ``asr`` factory_args (today's whole-utterance decode)."""
    spec = yaml.safe_load(data_path("voice-assistant.yaml").read_text())
    return dict(next(stage for stage in spec["stages"] if stage["name"] == "asr").get("factory_args") or {})


async def incremental(scheduler: StreamingAsrScheduler, rid: str, clip: np.ndarray, speed: float) -> tuple[str, float, float]:
    """Feed ``clip`` in 100 ms chunks at ``speed`` x real time; (transcript, tail s, share streamed before the end)."""
    loop = asyncio.get_running_loop()
    period = CHUNK / SAMPLE_RATE / speed if speed > 0 else 0.0
    streamed: list[str] = []
    start = loop.time()
    for index, offset in enumerate(range(0, clip.size, CHUNK)):
        # chunk `index` is recorded `index + 1` periods after the start
        await asyncio.sleep(max(0.0, start + (index + 1) * period - loop.time()))
        samples = clip[offset : offset + CHUNK]
        scheduler.inbox.put_nowait(
            IncomingMessage(IncomingKind.STREAM_CHUNK, rid, AudioChunk(samples=samples, sample_rate=SAMPLE_RATE))
        )
        while not scheduler.outbox.empty():
            streamed.append(scheduler.outbox.get_nowait().data.text)
    ended = time.perf_counter()
    scheduler.inbox.put_nowait(IncomingMessage(IncomingKind.STREAM_DONE, rid))
    before_end = len("".join(streamed))
    while True:
        message = await asyncio.wait_for(scheduler.outbox.get(), 300)
        if message.kind is OutgoingKind.STREAM:
            streamed.append(message.data.text)
            continue
        tail = time.perf_counter() - ended
        if message.kind is not OutgoingKind.RESULT or not isinstance(message.data, Transcript):
            raise RuntimeError(f"{rid}: {message.error or message}")
        text = message.data.text
        if "".join(streamed) != text:
            raise RuntimeError(f"{rid}: the deltas {streamed!r} do not add up to the transcript {text!r}")
        return text, tail, before_end / max(1, len(text))


async def measure(args: argparse.Namespace) -> list[Row]:
    settings = asr_settings()
    whole = SpeechRecognizer(
        language=settings.get("language", "en"),
        beam_size=settings.get("beam_size", 5),
        temperatures=settings.get("temperatures", 0.0),
        vad_filter=settings.get("vad_filter", False),
        initial_prompt=settings.get("initial_prompt"),
        without_timestamps=settings.get("without_timestamps", True),
        window_padding_s=settings.get("window_padding_s"),
        cpu_threads=settings.get("cpu_threads", 0),
    )
    decoder = WhisperDecoder(whole.model)  # the same loaded model
    schedulers: dict[str, StreamingAsrScheduler] = {}
    for cadence in args.cadences:
        incremental_settings = IncrementalSettings(
            cadence_s=cadence,
            beam_size=whole.beam_size,
            pass_beam_size=args.pass_beam,
            window_padding_s=whole.window_padding_s or 8.0,
            quiet_rms=args.quiet_rms,
            agreement=args.agreement,
            holdback_words=args.holdback,
        )
        name = f"incremental · every {cadence * 1000:g} ms · agree {args.agreement}" + (
            f" · pass beam {args.pass_beam}" if args.pass_beam else ""
        )
        schedulers[name] = StreamingAsrScheduler(decoder, incremental_settings)
        await schedulers[name].start()
    sets: list[tuple[str, list[Question], list[Voice]]] = [
        ("eval", list(QUESTIONS[: args.questions]), list(VOICES)),
        ("held-out", list(HELDOUT_QUESTIONS[: args.heldout]), list(HELDOUT_VOICES)),
    ]
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="omnictl-asr-incremental-") as tmp:
            speech = SpeechMaker(args.audio_dir or Path(tmp))
            for clip_set, questions, voices in sets:
                if not questions:
                    continue
                by_setting = {name: Row(clip_set, name) for name in ["whole (today)", *schedulers]}
                rows.extend(by_setting.values())
                clips = [(q, speech.speak(q.text, v)) for v in voices for q in questions]
                whole.transcribe(clips[0][1])  # first calls allocate; keep them out of the timings
                for index, (question, clip) in enumerate(clips):
                    seconds = clip.size / SAMPLE_RATE
                    # whole: the decode starts when the last chunk has come, so it is all tail
                    cpu, started = time.process_time(), time.perf_counter()
                    text = whole.transcribe(clip)
                    row = by_setting["whole (today)"]
                    row.tails.append(time.perf_counter() - started)
                    row.cpu_s += time.process_time() - cpu
                    _count(row, question, text, seconds, 0.0)
                    if args.misheard and word_errors(question.text, text)[0]:
                        print(f"  [whole] {question.text!r} heard as {text!r}", file=sys.stderr)
                    for name, scheduler in schedulers.items():
                        cpu = time.process_time()
                        text, tail, share = await incremental(scheduler, f"{clip_set}-{index}", clip, args.speed)
                        row = by_setting[name]
                        row.tails.append(tail)
                        row.cpu_s += time.process_time() - cpu
                        _count(row, question, text, seconds, share)
                        if args.misheard and word_errors(question.text, text)[0]:
                            print(f"  [{name}] {question.text!r} heard as {text!r}", file=sys.stderr)
                    if (index + 1) % 10 == 0:
                        print(f"{clip_set}: {index + 1}/{len(clips)} clips", file=sys.stderr)
    finally:
        for scheduler in schedulers.values():
            await scheduler.stop()
    return rows


def _count(row: Row, question: Question, text: str, seconds: float, share: float) -> None:
    edits, words = word_errors(question.text, text)
    row.clips += 1
    row.edits += edits
    row.words += words
    row.audio_s += seconds
    row.streamed_before_end.append(share)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="the eval set's first N questions (x its voices)")
    parser.add_argument("--heldout", type=int, default=len(HELDOUT_QUESTIONS), help="the first N held-out questions (x their voices)")
    parser.add_argument("--cadences", default="0.4", help="comma-separated: re-decode every this many seconds of new audio")
    parser.add_argument("--pass-beam", type=int, default=None, help="beam of the passes made while audio arrives (default: the final's)")
    parser.add_argument("--agreement", type=int, default=2, help="passes in a row that must agree on a word")
    parser.add_argument("--holdback", type=int, default=1, help="newest words of a pass never confirmed by it")
    parser.add_argument("--quiet-rms", type=float, default=0.01, help="IncrementalSettings.quiet_rms (0: always decode the tail)")
    parser.add_argument("--speed", type=float, default=1.0, help="times real time (0: as fast as it goes)")
    parser.add_argument("--audio-dir", type=Path, help="cache the spoken clips here (default: a temporary folder)")
    parser.add_argument("--misheard", action="store_true", help="list each transcript with word errors")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    args.cadences = [float(value) for value in args.cadences.split(",") if value.strip()]

    rows = asyncio.run(measure(args))
    print(f"{'set':9} {'setting':38} {'clips':>5} {'WER':>6} {'tail p50':>9} {'p90':>7} {'streamed':>9} {'CPU/audio':>9}")
    for row in rows:
        s = row.summary()
        print(
            f"{s['set']:9} {s['setting']:38} {s['clips']:5d} {s['wer']:6.1%} {s['tail_p50_s'] * 1000:7.0f}ms "
            f"{s['tail_p90_s'] * 1000:5.0f}ms {s['streamed_before_end']:9.0%} {s['cpu_per_audio_s']:9.2f}"
        )
    ok = True
    for clip_set in dict.fromkeys(row.clip_set for row in rows):
        of_set = [row for row in rows if row.clip_set == clip_set]
        baseline = of_set[0]
        for row in of_set[1:]:
            wer_met = row.wer <= baseline.wer
            tail_met = row.tail(0.5) <= TAIL_GOAL_S
            ok = ok and wer_met and tail_met
            print(
                f"{clip_set} · {row.setting}: WER {row.wer:.1%} <= whole {baseline.wer:.1%}: "
                f"{'met' if wer_met else 'NOT MET'}; tail p50 {row.tail(0.5) * 1000:.0f} ms <= "
                f"{TAIL_GOAL_S * 1000:.0f} ms (whole: {baseline.tail(0.5) * 1000:.0f} ms): {'met' if tail_met else 'NOT MET'}"
            )
    if args.json:
        json.dump([asdict(row) | row.summary() for row in rows], sys.stdout, indent=1)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
