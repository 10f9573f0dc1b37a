"""topologies/qwen3-asr.yaml on the real runtime (processes, ZeroMQ, shared memory) and the
real HTTP server, on CPU: one in-process ``omnictl serve`` (conftest's, shared with the
realtime module), its pipeline reached through the Python API as well."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.eval.samples import wav_bytes
from omnictl.coordinator.request import RequestEventKind
from omnictl.outputs import Transcript
from omnictl.profiling.store import TraceStore
from omnictl.serving.server import Listening
from tests.support.held import held_by

from .conftest import MAX_TOKENS, Reference, clip, on_loop, request

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a real serve of the tiny model (conftest's, shared)

STAGES = {"preprocessing", "audio_encoder", "decoder", "transcript"}


def transcribe(served: Listening, audio: Any, request_id: str | None = None, **fields: str) -> httpx.Response:
    files = {"file": ("clip.wav", wav_bytes(audio, 16_000), "audio/wav")}
    headers = {"X-Request-Id": request_id} if request_id else {}
    return httpx.post(served.url + "/v1/audio/transcriptions", files=files, data=fields, headers=headers, timeout=60)


def test_the_python_api_gives_transformers_greedy_answer_and_streams_it_first(
    served: Listening, reference: Reference
) -> None:
    audio = clip(1)

    async def run() -> tuple[dict[str, Any], list[Any]]:
        submitted = await served.pipeline.submit(request(audio, max_tokens=MAX_TOKENS))
        events = [event async for event in submitted.events()]
        return await submitted.result(), events

    results, events = on_loop(served, run())
    ids, parsed = reference.generate(audio, max_tokens=MAX_TOKENS)
    heard = results["transcript"]
    assert isinstance(heard, Transcript)
    assert heard.text == parsed["transcription"] and heard.segments[0].tokens == ids
    kinds = [event.kind for event in events]
    chunks = [e.data for e in events if e.kind is RequestEventKind.STREAM and e.stage == "transcript"]
    assert len(chunks) > 1 and all(isinstance(chunk, Transcript) for chunk in chunks)
    # the pieces came before the result, in order, each a new segment
    assert kinds.index(RequestEventKind.STREAM) < kinds.index(RequestEventKind.RESULT)
    assert [chunk.segments[0].id for chunk in chunks] == list(range(len(chunks)))


def test_transcriptions_json_text_and_verbose_json_are_transformers_answer(
    served: Listening, reference: Reference
) -> None:
    audio = clip(3)
    _, parsed = reference.generate(audio, max_tokens=MAX_TOKENS, language="en")
    ids, detected = reference.generate(audio, max_tokens=MAX_TOKENS)
    as_json = transcribe(served, audio)
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["text"] == detected["transcription"]
    as_text = transcribe(served, audio, response_format="text", language="en")
    assert as_text.status_code == 200 and as_text.text == parsed["transcription"]
    verbose = transcribe(served, audio, response_format="verbose_json").json()
    assert (verbose["text"], verbose["duration"]) == (detected["transcription"], 1.5)
    assert [(s["start"], s["end"], s["tokens"]) for s in verbose["segments"]] == [(0.0, 1.5, ids)]


def test_what_the_model_cannot_do_is_a_400_naming_the_field(served: Listening) -> None:
    for fields, field in (({"language": "xx"}, "language"), ({"temperature": "0.7"}, "temperature")):
        answer = transcribe(served, clip(1), **fields)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == field, answer.text


def test_stream_true_sends_deltas_then_done_with_transformers_text(served: Listening, reference: Reference) -> None:
    audio = clip(2)
    _, parsed = reference.generate(audio, max_tokens=MAX_TOKENS)
    files = {"file": ("clip.wav", wav_bytes(audio, 16_000), "audio/wav")}
    events = []
    with httpx.stream(
        "POST", served.url + "/v1/audio/transcriptions", files=files, data={"stream": "true"}, timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "transcript.text.done"
    assert events[-1]["text"] == parsed["transcription"]
    assert "".join(deltas).strip() == parsed["transcription"]


def test_an_abort_mid_stream_leaves_nothing_held(served: Listening) -> None:
    async def run() -> list[str]:
        submitted = await served.pipeline.submit(request(clip(4), max_tokens=4096))
        async for event in submitted.events():
            if event.kind is RequestEventKind.STREAM:
                break  # the decoder is writing: drop it there
        await served.pipeline.abort(submitted.id)
        return await held_by(served.pipeline)

    assert on_loop(served, run()) == []


def test_a_client_leaving_a_streamed_transcription_leaves_nothing_held(served: Listening) -> None:
    files = {"file": ("clip.wav", wav_bytes(clip(5, seconds=3.0), 16_000), "audio/wav")}
    # the served default caps it at MAX_TOKENS: the Python API's abort above is the long one
    with httpx.stream(
        "POST", served.url + "/v1/audio/transcriptions", files=files, data={"stream": "true"}, timeout=60
    ) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # one event in, then hang up
    assert on_loop(served, held_by(served.pipeline)) == []


def test_the_trace_shows_every_stage(served: Listening, run_dir: Path) -> None:
    request_id = f"asr-{uuid.uuid4().hex[:8]}"
    assert transcribe(served, clip(1), request_id=request_id).status_code == 200
    deadline = time.monotonic() + 20
    while True:  # stages send their records in batches
        stages = {event.stage for event in TraceStore(run_dir).events(request_id)} - {None, ""}
        if STAGES <= stages or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert STAGES <= stages, sorted(stages)
