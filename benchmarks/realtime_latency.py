"""End of speech → first audio: ``/v1/realtime`` against chat completions, on one server.

Every path answers the same spoken sample questions (Piper, in ``omnictl/data/samples``)
with the same models and the same ``max_tokens``, against one real ``omnictl serve``
(started here on the embedded voice assistant, or ``--url``), question by question,
paths alternating:

- **chat**: ``POST /v1/chat/completions`` streamed, the question as a WAV ``input_audio``
  part, text + pcm16 audio out. The clock starts when the request is sent: the whole
  recording exists only once the speaker has stopped.
- **realtime, manual commit**: the question appended to the session while it is spoken
  (100 ms chunks, paced in real time), then ``input_audio_buffer.commit`` and
  ``response.create``; the clock starts at the commit (a push-to-talk button released).
- **realtime, server VAD**: the question streamed in real time and followed by silence;
  the server hears the end of speech (Silero VAD, ``--silence-ms`` of quiet) and answers
  on its own. The clock starts when the last chunk holding speech was sent (the end of
  speech as ``speech_stopped.audio_end_ms`` dates it), so the VAD's wait counts.

Reported per question and as medians: end of speech → first audio delta, per path.

Run: ``python benchmarks/realtime_latency.py [--rounds 1] [--max-tokens 40] [--silence-ms 500] [--url URL]``
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import openai
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.serving.harness starts and stops the server

from omnictl.inputs import PCM16_RATE, resample  # noqa: E402
from benchmarks.eval.samples import sample_names, sample_path, sample_question  # noqa: E402
from tests.serving.harness import start_server, stop_server  # noqa: E402

CHUNK_MS = 100
PATHS = ("chat", "realtime commit", "realtime VAD")


def pcm24(name: str) -> bytes:
    samples, rate = sample_question(name)
    audio = resample(samples, rate, PCM16_RATE)
    return bytes((np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes())


def paced(pcm: bytes, send: Callable[[str], None]) -> list[tuple[float, float]]:
    """Send ``pcm`` in 100 ms appends at the pace it is spoken; (audio ms sent, when) per chunk."""
    step = PCM16_RATE * CHUNK_MS // 1000 * 2
    sent, start = [], time.perf_counter()
    for index, offset in enumerate(range(0, len(pcm), step)):
        delay = start + index * CHUNK_MS / 1000 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(base64.b64encode(pcm[offset : offset + step]).decode())
        sent.append(((offset + step) / 2 / PCM16_RATE * 1000, time.perf_counter()))
    return sent


def chat(client: openai.OpenAI, name: str, max_tokens: int) -> float:
    data = base64.b64encode(sample_path(name).read_bytes()).decode()
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="voice-assistant", modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}],
        max_tokens=max_tokens, stream=True,
    )
    first = None
    for chunk in stream:
        for choice in chunk.choices:
            audio = getattr(choice.delta, "audio", None) or (choice.delta.model_extra or {}).get("audio")
            if first is None and audio:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"chat: no audio for {name}")
    return first


def _first_audio(connection: Any) -> float:
    while True:
        event = connection.recv()
        if event.type == "response.output_audio.delta":
            return time.perf_counter()
        if event.type == "response.done":
            raise RuntimeError(f"realtime: the response ended without audio ({event.response.status})")
        if event.type == "error":
            raise RuntimeError(f"realtime: {event.error.message}")


def _drain(connection: Any) -> None:
    while connection.recv().type != "response.done":
        pass


def realtime(client: openai.OpenAI, name: str, max_tokens: int, vad: bool, silence_ms: int) -> float:
    with client.realtime.connect(model="voice-assistant") as connection:
        connection.recv()  # session.created
        detection = {"type": "server_vad", "silence_duration_ms": silence_ms} if vad else None
        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": max_tokens,
                                           "audio": {"input": {"turn_detection": detection}}})
        connection.recv()  # session.updated
        append = lambda audio: connection.input_audio_buffer.append(audio=audio)  # noqa: E731
        speech = pcm24(name)
        if not vad:
            paced(speech, append)
            started = time.perf_counter()
            connection.input_audio_buffer.commit()
            connection.response.create()
            first = _first_audio(connection) - started
            _drain(connection)
            return first
        sent = paced(speech + bytes(PCM16_RATE * 2 * 2), append)  # then 2 s of silence
        while (event := connection.recv()).type != "input_audio_buffer.speech_stopped":
            pass
        end_ms = event.audio_end_ms
        ended = next(at - (ms - end_ms) / 1000 for ms, at in sent if ms >= end_ms)
        first = _first_audio(connection) - ended
        _drain(connection)
        return first


def main(args: argparse.Namespace) -> None:
    console = Console()
    names = [n for n in args.questions.split(",") if n] or sample_names()
    server = None
    url = args.url
    if url is None:
        console.print("starting omnictl serve (the embedded voice assistant)...")
        server = start_server(ready_timeout=300)
        url = server.url
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=args.api_key, max_retries=0, timeout=300)
        chat(client, names[0], args.max_tokens)  # warm up: first requests pay one-time costs
        realtime(client, names[0], args.max_tokens, vad=False, silence_ms=args.silence_ms)
        results: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PATHS} for n in names}
        for _ in range(args.rounds):
            for name in names:
                results[name]["chat"].append(chat(client, name, args.max_tokens))
                results[name]["realtime commit"].append(realtime(client, name, args.max_tokens, False, args.silence_ms))
                results[name]["realtime VAD"].append(realtime(client, name, args.max_tokens, True, args.silence_ms))
    finally:
        if server is not None:
            stop_server(server)
    table = Table(title=f"end of speech → first audio, ms (max_tokens {args.max_tokens}, VAD silence {args.silence_ms} ms, "
                        f"{args.rounds} round(s))")
    table.add_column("question")
    for path in PATHS:
        table.add_column(path, justify="right")
    for name in names:
        table.add_row(name, *(f"{statistics.median(results[name][p]) * 1000:.0f}" for p in PATHS))
    medians = [statistics.median([t for n in names for t in results[n][p]]) * 1000 for p in PATHS]
    table.add_row("[bold]median[/]", *(f"[bold]{m:.0f}[/]" for m in medians))
    console.print(table)
    console.print(f"realtime VAD includes its {args.silence_ms} ms wait for silence; without it: "
                  f"{medians[2] - args.silence_ms:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--questions", default="", help=f"comma-separated, from: {', '.join(sample_names())}")
    parser.add_argument("--url", default=None, help="a running omnictl serve (default: start one here)")
    parser.add_argument("--api-key", default="none")
    main(parser.parse_args())
