"""The OpenAI-compatible API, through the official `openai` client, against a real server."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
import wave
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.serving.harness import API_KEY, ServerProcess, wait_until

WORD_SECONDS = 0.1  # each word of the fast topology's answer is spoken as a 0.1 s tone


def audio_of(delta: Any) -> dict[str, Any] | None:
    """A delta's audio: older `openai` releases have no typed field (an extra), newer ones do."""
    typed = getattr(delta, "audio", None)
    if typed is not None:
        return typed if isinstance(typed, dict) else typed.model_dump()
    extra: dict[str, Any] | None = (delta.model_extra or {}).get("audio")
    return extra


@pytest.fixture()
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=30, max_retries=0)


def test_text_completion(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=[{"role": "user", "content": "hello big world"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: hello big world"
    assert completion.choices[0].message.audio is None
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 4)
    assert completion.usage.total_tokens == 7
    assert raw.headers["x-request-id"] == completion.id
    assert completion.id.startswith("chatcmpl-")


def test_text_and_wav_audio(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="fast", modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
        messages=[{"role": "user", "content": "say two"}],
    )
    message = completion.choices[0].message
    assert message.content == "echo: say two" and message.audio is not None
    assert message.audio.transcript == "echo: say two"
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as wav:
        assert wav.getframerate() == 16000
        assert wav.getnframes() == round(3 * WORD_SECONDS * 16000)


def test_streaming_text_and_pcm16_audio(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fast", modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "user", "content": "one two three"}], stream=True,
    )
    text, audio, transcript, usage, finish = [], bytearray(), [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            if choice.delta.content:
                text.append(choice.delta.content)
            delta_audio = audio_of(choice.delta)
            if delta_audio:
                audio += base64.b64decode(delta_audio["data"])
                transcript.append(delta_audio["transcript"])
    assert "".join(text) == "echo: one two three"
    assert len(text) == 4  # word by word, not one lump
    assert len(transcript) == 4 and "".join(transcript).split() == ["echo:", "one", "two", "three"]
    assert len(audio) == 2 * round(4 * WORD_SECONDS * 24000)  # pcm16 at 24 kHz
    samples = np.frombuffer(bytes(audio), "<i2")
    assert 10000 < int(samples.max()) < 14000  # the 0.4-amplitude tone survived encoding
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 4


def test_input_audio_reaches_the_pipeline(client: openai.OpenAI) -> None:
    pcm = (np.zeros(1600, dtype="<i2")).tobytes()
    data = base64.b64encode(pcm).decode()
    messages: Any = [{"role": "user", "content": [
        {"type": "text", "text": "listen"},
        {"type": "input_audio", "input_audio": {"data": data, "format": "pcm16"}},
    ]}]
    completion = client.chat.completions.create(model="fast", messages=messages)
    # decoded once by the server: the entry stage gets pcm16's samples at its 24 kHz
    assert completion.choices[0].message.content == "echo: listen audio(1600 samples at 24000 Hz)"


def test_stage_failure_mid_stream_raises_in_the_client(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": "please explode"}], stream=True
    )
    with pytest.raises(openai.APIError, match="prep"):
        for _ in stream:
            pass


def test_stage_failure_without_streaming_is_a_5xx(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="exploded on purpose"):
        client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "explode now"}])


def test_models_health_and_metrics(server: ServerProcess, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["fast"]
    health = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and set(body["stages"]) == {"prep", "answer", "speak"}
    assert health.headers["x-request-id"]

    def completed() -> float:
        text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
        line = next(l for l in text.splitlines() if l.startswith('omnictl_requests_total{outcome="completed"}'))
        return float(line.split()[-1])

    before = completed()
    client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "count me"}])
    assert completed() == before + 1
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text
    for name in ("omnictl_time_to_first_text_seconds_bucket", "omnictl_request_latency_seconds_count",
                 "omnictl_requests_in_flight", "omnictl_time_to_first_audio_seconds_count"):
        assert name in metrics
    # per-stage and per-edge latency come from the profiler, which ships events asynchronously
    wait_until(lambda: 'omnictl_stage_latency_seconds{quantile="0.5",stage="answer"}'
               in httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text)
    assert 'omnictl_edge_latency_seconds_count{dst="answer"' in httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text


def test_audio_continuity_metrics_after_one_stream_are_promtool_clean(server: ServerProcess,
                                                                       client: openai.OpenAI) -> None:
    def scrape() -> str:
        return httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).text

    def streams(text: str) -> float:
        prefix = 'omnictl_audio_streams_total{endpoint="/v1/chat/completions",model="fast"}'
        return next((float(l.split()[-1]) for l in text.splitlines() if l.startswith(prefix)), 0.0)

    before = streams(scrape())
    stream = client.chat.completions.create(
        model="fast", modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "user", "content": "four words of audio"}], stream=True,
    )
    assert sum(1 for chunk in stream for c in chunk.choices if audio_of(c.delta)) == 5  # "echo:" and 4 words
    wait_until(lambda: streams(scrape()) == before + 1)  # observed when the stream ends
    text = scrape()
    labels = '{endpoint="/v1/chat/completions",model="fast"}'
    for family in ("omnictl_audio_time_to_first_packet_seconds", "omnictl_audio_real_time_factor_ratio",
                   "omnictl_audio_largest_underrun_seconds", "omnictl_audio_chunk_interval_seconds"):
        line = next(l for l in text.splitlines() if l.startswith(f"{family}_count{labels}"))
        assert float(line.split()[-1]) >= 1, line
    # the fast stage sends its tones at once: 0.5 s of audio never runs out, so the stream
    # counts as continuous at every threshold
    assert ('omnictl_audio_continuous_streams_total{endpoint="/v1/chat/completions",model="fast",'
            f'threshold_ms="100"}} {before + 1}') in text
    assert "request_id" not in text and "chatcmpl-" not in text  # labelled by model and endpoint only
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: scripts/setup.sh installs it (Debian's prometheus package)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
