"""A live conversation over ``/v1/realtime``: end of speech → first answer audio, false
cut-offs and accuracy, with the server's defaults (issue 39's goals).

One real ``omnictl serve`` (started here on the embedded voice assistant, or ``--url``); the
official ``openai`` client; each question streamed in 100 ms appends at the pace it is
spoken, then silence, on a session left as created (its default turn detection, voice and
output), as a new user would. The questions are the answer-quality eval set's
(``benchmarks/eval/quality.py``), spoken by the Piper voice; the clips are made here.

- **c=1** and **c=4**: one session, then four at once (each its own share of the
  questions). From the moment the last append holding speech was sent (the end of the
  question's voiced audio) to the first ``response.output_audio.delta``. Goals: p50 ≤ 500 ms
  at one session, ≤ 800 ms at four.
- **cut-offs**: each question with a 600 ms pause mid-sentence ("What is the capital of ...
  Germany?"). A cut-off: a response begins (``response.created`` or answer audio) before the
  last append of the question was sent. Goal: ≤ 10 %, and the answer is to the whole
  question (it is scored like the others).
- **accuracy**: answers judged right (``is_correct``: an accepted word in the first
  sentence) over realtime at c=1, against ``POST /v1/chat/completions`` with the same clip
  as a WAV (the turn-based path: the whole utterance, then the answer). Goal: no worse.
- **deltas while speaking**: questions (c=1) with a
  ``conversation.item.input_audio_transcription.delta`` before the end of their speech (the
  turn transcribed while spoken, with server defaults). Goal: every question.
- **CPU per turn**: the server's processes' CPU seconds (all of them, children included:
  ``psutil``; only for a server started here) over each phase, per turn; and the seconds
  dropped early answers ran before their drop (``omnictl_realtime_preemptive_dropped_seconds``
  from ``/metrics``) as a share of the phase's wall time on the turns' side, with the early
  answers used and dropped.

Each figure is printed with met / not met.

Run: ``python benchmarks/realtime_latency.py [--questions 20] [--pause-questions 20] [--url URL]``
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import openai
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.serving.harness starts and stops the server

from benchmarks.eval.quality import QUESTIONS, SAMPLE_RATE, VOICES, Question, SpeechMaker, is_correct  # noqa: E402
from benchmarks.eval.samples import wav_bytes  # noqa: E402
from benchmarks.realtime_turn_detection import with_pause  # noqa: E402
from omnictl.inputs import PCM16_RATE, resample  # noqa: E402
from tests.serving.harness import start_server, stop_server  # noqa: E402

CHUNK_MS = 100
TRAILING_SILENCE_S = 3.0  # after the question: time for any turn detection to end the turn
PAUSE_MS = 600
GOAL_C1_MS, GOAL_C4_MS, GOAL_CUT_OFFS = 500, 800, 0.10
VOICED = 0.02  # |sample| above this is speech (the clips are clean synthetic speech)


@dataclass
class Turn:
    """One question asked over realtime: what the benchmark saw."""

    question: Question
    first_audio_ms: float | None = None  # from the end of speech
    cut_off: bool = False  # a response began before the question was all sent
    answer: str = ""
    error: str | None = None
    deltas_before_end: int = 0  # transcription deltas that came before the speech ended


def pcm16(audio: np.ndarray) -> bytes:
    return bytes((np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes())


def speech_end_chunk(audio: np.ndarray) -> int:
    """The index of the 100 ms append that holds the last voiced sample."""
    last = int(np.nonzero(np.abs(audio) > VOICED)[0][-1])
    return last // (PCM16_RATE * CHUNK_MS // 1000)


def paced(pcm: bytes, send: Callable[[str], None]) -> list[float]:
    """Send ``pcm`` in 100 ms appends at the pace it is spoken; when each append was sent."""
    step = PCM16_RATE * CHUNK_MS // 1000 * 2
    sent, start = [], time.perf_counter()
    for index, offset in enumerate(range(0, len(pcm), step)):
        delay = start + index * CHUNK_MS / 1000 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(base64.b64encode(pcm[offset : offset + step]).decode())
        sent.append(time.perf_counter())
    return sent


def ask_realtime(client: openai.OpenAI, question: Question, audio: np.ndarray) -> Turn:
    """Stream ``audio`` (24 kHz) into a session with the server's defaults, then silence;
    read events on a thread meanwhile (a response may begin while the question is sent)."""
    turn = Turn(question)
    events: list[tuple[float, Any]] = []
    done = threading.Event()
    with client.realtime.connect(model="voice-assistant") as connection:
        connection.recv()  # session.created: its defaults are what is measured

        def read() -> None:
            try:
                while True:
                    event = connection.recv()
                    events.append((time.perf_counter(), event))
                    if event.type in ("response.done", "error"):
                        break
            except Exception as exc:  # the connection closed under the reader: say so in the result
                turn.error = f"{type(exc).__name__}: {exc}"
            finally:
                done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        speech = pcm16(audio) + bytes(int(PCM16_RATE * TRAILING_SILENCE_S) * 2)
        sent = paced(speech, lambda chunk: connection.input_audio_buffer.append(audio=chunk))
        done.wait(120)
    question_sent = sent[speech_end_chunk(audio)]
    for at, event in events:
        if event.type == "error":
            turn.error = event.error.message
        elif event.type in ("response.created", "response.output_audio.delta") and at < question_sent:
            turn.cut_off = True
        elif event.type == "response.output_audio.delta" and turn.first_audio_ms is None:
            turn.first_audio_ms = (at - question_sent) * 1000
        elif event.type == "conversation.item.input_audio_transcription.delta" and at < question_sent:
            turn.deltas_before_end += 1
        elif event.type == "response.output_audio_transcript.delta":
            turn.answer += event.delta
        elif event.type == "response.done" and event.response.status != "completed" and turn.error is None:
            turn.error = f"response {event.response.status}"
    if not done.is_set():
        turn.error = "no response.done within 120 s"
    return turn


def ask_chat(client: openai.OpenAI, question: Question, clip16: np.ndarray) -> str:
    """The turn-based path: the whole recording as a WAV, the answer's text."""
    data = base64.b64encode(wav_bytes(clip16, SAMPLE_RATE)).decode()
    reply = client.chat.completions.create(
        model="voice-assistant",
        messages=[
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}
        ],
    )
    return reply.choices[0].message.content or ""


def at_once(client: openai.OpenAI, work: list[tuple[Question, np.ndarray]], sessions: int) -> list[Turn]:
    """``sessions`` clients at once, each asking its share of ``work`` one after another."""
    results: list[list[Turn]] = [[] for _ in range(sessions)]

    def client_loop(index: int) -> None:
        for question, audio in work[index::sessions]:
            results[index].append(ask_realtime(client, question, audio))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [turn for batch in results for turn in batch]


@dataclass
class Spent:
    """What the server spent over one phase."""

    turns: int
    wall_s: float
    cpu_s: float | None  # its processes' CPU seconds (None: a server not started here)
    dropped_s: float  # seconds dropped early answers ran before their drop
    used: int  # early answers used
    dropped: int  # ... and dropped


class Meter:
    """The server's CPU time (its process and every child: the stage processes) and its
    early-answer counters from /metrics, read before and after a phase."""

    def __init__(self, url: str, pid: int | None, api_key: str) -> None:
        self.url, self.api_key = url, api_key
        self.process = psutil.Process(pid) if pid is not None else None

    def _cpu(self) -> float | None:
        if self.process is None:
            return None
        total = 0.0
        for proc in [self.process, *self.process.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:  # ended meanwhile (its time is lost to the figure)
                continue
            total += times.user + times.system
        return total

    def _metrics(self) -> dict[str, float]:
        import urllib.request

        request = urllib.request.Request(self.url + "/metrics", headers={"Authorization": f"Bearer {self.api_key}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read().decode()
        wanted = {
            'omnictl_realtime_preemptive_answers_total{outcome="used"}': "used",
            'omnictl_realtime_preemptive_answers_total{outcome="dropped"}': "dropped",
            "omnictl_realtime_preemptive_dropped_seconds_total": "dropped_s",
        }
        found = dict.fromkeys(wanted.values(), 0.0)
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name in wanted:
                found[wanted[name]] = float(value)
        return found

    def measure(self, phase: Callable[[], list[Turn]]) -> tuple[list[Turn], Spent]:
        cpu, metrics, start = self._cpu(), self._metrics(), time.perf_counter()
        turns = phase()
        wall = time.perf_counter() - start
        cpu_after, after = self._cpu(), self._metrics()
        spent = None if cpu is None or cpu_after is None else cpu_after - cpu
        return turns, Spent(
            len(turns),
            wall,
            spent,
            after["dropped_s"] - metrics["dropped_s"],
            int(after["used"] - metrics["used"]),
            int(after["dropped"] - metrics["dropped"]),
        )


def report_spent(label: str, spent: Spent) -> None:
    cpu = "n/a (a server not started here)" if spent.cpu_s is None else f"{spent.cpu_s / max(spent.turns, 1):.2f} s"
    print(
        f"{label}: CPU per turn {cpu} (wall {spent.wall_s / max(spent.turns, 1):.1f} s a turn); early answers "
        f"{spent.used} used, {spent.dropped} dropped, the dropped ones ran {spent.dropped_s:.2f} s before their drop "
        f"({spent.dropped_s / max(spent.wall_s, 1e-9):.1%} of the phase's wall time)"
    )


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def report_latency(label: str, turns: list[Turn], goal_ms: float) -> None:
    latencies = [t.first_audio_ms for t in turns if t.first_audio_ms is not None]
    failed = [t for t in turns if t.error is not None]
    p90 = float(np.percentile(latencies, 90)) if latencies else float("nan")
    print(
        f"{label}: end of speech -> first audio p50 {p50(latencies):.0f} ms, p90 {p90:.0f} ms "
        f"({len(latencies)}/{len(turns)} answered with audio): goal <= {goal_ms:.0f} ms: "
        f"{verdict(p50(latencies) <= goal_ms)}"
    )
    for turn in failed:
        print(f"  failed: {turn.question.text!r}: {turn.error}")


def main(args: argparse.Namespace) -> int:
    piper = next(v for v in VOICES if v.engine == "piper")
    questions = list(QUESTIONS[: max(args.questions, args.pause_questions)])
    with tempfile.TemporaryDirectory() as scratch:
        speech = SpeechMaker(args.audio_dir or Path(scratch))
        clips16 = {q.text: speech.speak(q.text, piper) for q in questions}
    clips = {text: resample(clip, SAMPLE_RATE, PCM16_RATE) for text, clip in clips16.items()}
    server = None
    url = args.url
    if url is None:
        print("starting omnictl serve (the embedded voice assistant, server defaults)...", flush=True)
        server = start_server(ready_timeout=300)
        url = server.url
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=args.api_key, max_retries=0, timeout=300)
        meter = Meter(url, server.process.pid if server is not None else None, args.api_key)
        warm = questions[0]
        ask_chat(client, warm, clips16[warm.text])  # first requests pay one-time costs
        ask_realtime(client, warm, clips[warm.text])
        plain = [(q, clips[q.text]) for q in questions[: args.questions]]
        one, spent_one = meter.measure(lambda: at_once(client, plain, 1))
        four, spent_four = meter.measure(lambda: at_once(client, plain, 4))
        paused = [(q, with_pause(clips[q.text], PAUSE_MS)) for q in questions[: args.pause_questions]]
        cut, spent_cut = meter.measure(lambda: at_once(client, paused, 1))
        chat_right = sum(is_correct(ask_chat(client, q, clips16[q.text]), q) for q, _ in plain)
    finally:
        if server is not None:
            stop_server(server)
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    print(f"{len(plain)} questions (Piper voice), streamed in {CHUNK_MS} ms appends at real time, server defaults")
    print(f"machine: {psutil.cpu_count()} CPUs, load average {load} at the end")
    report_latency("c=1", one, GOAL_C1_MS)
    report_latency("c=4", four, GOAL_C4_MS)
    heard = sum(t.deltas_before_end > 0 for t in one)
    print(
        f"transcription deltas before the end of speech (c=1): {heard}/{len(one)} questions: goal every question: "
        f"{verdict(heard == len(one))}"
    )
    report_spent("c=1", spent_one)
    report_spent("c=4", spent_four)
    report_spent(f"{PAUSE_MS} ms pauses", spent_cut)
    cut_offs = sum(t.cut_off for t in cut)
    whole = sum(is_correct(t.answer, t.question) for t in cut)
    print(
        f"cut-offs ({PAUSE_MS} ms pause mid-question): {cut_offs}/{len(cut)} ({cut_offs / len(cut):.0%}) answered "
        f"before the question ended: goal <= {GOAL_CUT_OFFS:.0%}: {verdict(cut_offs / len(cut) <= GOAL_CUT_OFFS)}; "
        f"answers right to the whole question: {whole}/{len(cut)}"
    )
    for turn in cut:
        if turn.cut_off:
            print(f"  cut off: {turn.question.text!r} -> {turn.answer!r}")
        elif not is_correct(turn.answer, turn.question):
            print(f"  wrong with the pause: {turn.question.text!r} -> {turn.answer!r}")
    realtime_right = sum(is_correct(t.answer, t.question) for t in one)
    print(
        f"accuracy: realtime {realtime_right}/{len(one)} right, chat completions (whole recording) "
        f"{chat_right}/{len(plain)}: no worse: {verdict(realtime_right >= chat_right)}"
    )
    for turn in one:
        if not is_correct(turn.answer, turn.question):
            print(f"  wrong over realtime: {turn.question.text!r} -> {turn.answer!r}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="eval questions for c=1, c=4 and accuracy")
    parser.add_argument("--pause-questions", type=int, default=20, help="eval questions asked with a pause")
    parser.add_argument("--audio-dir", type=Path, help="cache spoken clips here (default: a temporary folder)")
    parser.add_argument("--url", default=None, help="a running omnictl serve (default: start one here)")
    parser.add_argument("--api-key", default="none")
    sys.exit(main(parser.parse_args()))
