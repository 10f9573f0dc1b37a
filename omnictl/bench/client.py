"""One streamed request, timed as it arrives: a chat completion delta by delta, a speech
request (``/v1/audio/speech``) chunk of audio by chunk, a transcription
(``/v1/audio/transcriptions``, ``stream=true``) delta by delta."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx

from omnictl.bench.stats import RequestRecord
from omnictl.inputs import PCM16_RATE  # the server's pcm16 convention (OpenAI's)


def _apply_chunk(record: RequestRecord, chunk: dict[str, Any], now: float, last_text: list[float]) -> None:
    if "error" in chunk:
        error = chunk["error"]
        record.error = str(error.get("message") if isinstance(error, dict) else error)
        return
    usage = chunk.get("usage")
    if usage:
        record.output_tokens = int(usage.get("completion_tokens") or record.output_tokens)
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            if record.ttft is None:
                record.ttft = now
            if last_text:
                record.itl.append(now - last_text[0])
            last_text[:] = [now]
        audio = delta.get("audio")
        if audio and audio.get("data"):
            if record.ttfa is None:
                record.ttfa = now
            record.last_audio = now
            seconds = len(base64.b64decode(audio["data"])) / 2 / PCM16_RATE
            record.audio_seconds += seconds
            record.audio_chunks.append((now, seconds))  # the client's own playback clock reads these


async def send_request(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], record: RequestRecord, headers: dict[str, str]
) -> RequestRecord:
    """Stream one request into ``record``; never raises for a failed request, records why."""
    start = time.perf_counter()
    last_text: list[float] = []
    text_deltas = 0
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            record.request_id = response.headers.get("x-request-id")
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                record.overloaded = response.status_code == 429
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                before = len(record.itl) + (record.ttft is not None)
                _apply_chunk(record, chunk, time.perf_counter() - start, last_text)
                text_deltas += (len(record.itl) + (record.ttft is not None)) > before
                if record.error is not None:
                    return record
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.e2e = time.perf_counter() - start
    if record.output_tokens == 0:  # a server without usage: count deltas instead
        record.output_tokens = text_deltas
    record.ok = True
    return record


def _failed(record: RequestRecord, status: int, body: bytes) -> RequestRecord:
    record.error = f"HTTP {status}: {body.decode(errors='replace')[:300]}"
    record.overloaded = status == 429
    return record


async def send_speech(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], record: RequestRecord, headers: dict[str, str]
) -> RequestRecord:
    """Stream one ``/v1/audio/speech`` request (raw pcm16 at 24 kHz, ``stream_format: audio``)
    into ``record``: first audio, each chunk's seconds on the receive clock, the last audio;
    never raises for a failed request, records why."""
    start = time.perf_counter()
    received = 0  # bytes of pcm16 so far (a chunk may split a sample: seconds are counted from the total)
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            record.request_id = response.headers.get("x-request-id")
            if response.status_code != 200:
                return _failed(record, response.status_code, await response.aread())
            async for chunk in response.aiter_bytes():
                if not chunk:
                    continue
                now = time.perf_counter() - start
                if record.ttfa is None:
                    record.ttfa = now
                before = received // 2 / PCM16_RATE
                received += len(chunk)
                seconds = received // 2 / PCM16_RATE - before
                record.last_audio = now
                record.audio_seconds += seconds
                record.audio_chunks.append((now, seconds))
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.e2e = time.perf_counter() - start
    record.ok = True
    return record


async def send_transcription(
    client: httpx.AsyncClient,
    url: str,
    form: dict[str, str],
    wav: bytes,
    record: RequestRecord,
    headers: dict[str, str],
    seconds: float,
) -> RequestRecord:
    """Stream one ``/v1/audio/transcriptions`` request (``stream=true``) into ``record``: the
    first delta (``ttft``), the gaps between deltas, the latency; ``seconds``: the clip's
    length, which the real-time factor divides by. Never raises for a failed request."""
    start = time.perf_counter()
    record.input_seconds = seconds
    last: list[float] = []
    deltas = 0
    done = False
    try:
        files = {"file": ("bench.wav", wav, "audio/wav")}
        async with client.stream("POST", url, data=form, files=files, headers=headers) as response:
            record.request_id = response.headers.get("x-request-id")
            if response.status_code != 200:
                return _failed(record, response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                now = time.perf_counter() - start
                if "error" in event:
                    error = event["error"]
                    record.error = str(error.get("message") if isinstance(error, dict) else error)
                    return record
                if event.get("type") == "transcript.text.delta":
                    deltas += 1
                    if record.ttft is None:
                        record.ttft = now
                    if last:
                        record.itl.append(now - last[0])
                    last[:] = [now]
                elif event.get("type") == "transcript.text.done":
                    done = True
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    if not done:
        record.error = "the stream ended without transcript.text.done"
        return record
    record.e2e = time.perf_counter() - start
    record.output_tokens = deltas
    record.ok = True
    return record
