"""``/v1/audio/speech`` and ``/v1/audio/transcriptions`` (and translations) in the test
process, against a scripted pipeline: the body and form checks naming their field, what
reaches the pipeline, the answer in each format, and the one outcome of each request."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from omnictl.coordinator.request import RequestEvent, RequestEventKind
from omnictl.exceptions import InvalidRequest
from omnictl.inputs import SpeechRequest
from omnictl.outputs import Transcript, TranscriptSegment, TranscriptWord
from omnictl.serving.app import create_app
from omnictl.serving.chat.protocol import Limits
from omnictl.serving.speech.route import IGNORED_HEADER, MAX_INPUT_CHARS, parse_speech
from omnictl.serving.state import ServingState
from omnictl.serving.transcriptions.route import srt, vtt
from tests.serving.scripted import ScriptedPipeline, audio_events, end_in_flight_soon, error_event
from tests.test_inputs import tone, wav_bytes

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


def serve(pipeline: ScriptedPipeline, **state: Any) -> tuple[TestClient, ServingState]:
    serving = ServingState(model_name="m", pipeline=pipeline, api_key=KEY, **state)
    return TestClient(create_app(serving), base_url="http://localhost"), serving


def sse_events(text: str) -> list[Any]:
    return [json.loads(b[len("data: "):]) for b in text.split("\n\n") if b.startswith("data: ")]


# --- speech -----------------------------------------------------------------------------


def speech_refusal(body: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_speech(body)
    return caught.value


def test_parse_speech_takes_the_openai_fields() -> None:
    request, fmt, sse, model, instructions = parse_speech(
        {"model": "tts-1", "input": "Hello.", "voice": "amy", "response_format": "wav", "stream_format": "sse",
         "speed": 2, "instructions": "cheerful"}
    )
    assert request == SpeechRequest(text="Hello.", voice="amy", speed=2.0)
    assert (fmt, sse, model, instructions) == ("wav", True, "tts-1", True)
    default = parse_speech({"input": "Hi", "voice": "alloy", "speed": None})
    assert default[0] == SpeechRequest(text="Hi", voice=None, speed=1.0)  # an OpenAI voice: the default one
    assert default[1:] == ("mp3", False, "", False)
    assert parse_speech({"input": "Hi", "instructions": ""})[4] is False
    assert parse_speech({"input": "x" * MAX_INPUT_CHARS})[0].text == "x" * MAX_INPUT_CHARS
    assert parse_speech({"input": "Hi", "speed": 0.25})[0].speed == 0.25
    assert parse_speech({"input": "Hi", "speed": 4.0})[0].speed == 4.0


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([], "body", "'body' must be a JSON object"),
        ({"input": "hi", "pitch": 2}, "pitch",
         "is not a field of this endpoint (expected one of input, instructions, max_new_tokens, model, "
         "response_format, seed, speed, stream, stream_format, temperature, top_k, top_p, voice)"),
        ({"input": "\0" * 100}, "input", "has nothing to speak"),
        ({"input": "\U0001F600" * 1000}, "input", "has nothing to speak"),
        ({"input": "." * MAX_INPUT_CHARS}, "input", "has nothing to speak"),
        ({"input": "hi", "stream": "yes"}, "stream", "must be true or false"),
        ({"input": "hi", "stream": True, "stream_format": "audio"}, "stream", "asks for the SSE stream"),
        ({}, "input", "must be non-empty text"),
        ({"input": "   "}, "input", "must be non-empty text"),
        ({"input": 5}, "input", "must be non-empty text"),
        ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input", f"{MAX_INPUT_CHARS + 1} characters; the limit is {MAX_INPUT_CHARS}"),
        ({"input": "hi", "voice": ""}, "voice", "must be a voice name"),
        ({"input": "hi", "voice": 3}, "voice", "got int"),
        ({"input": "hi", "response_format": "ogg"}, "response_format", "'ogg' is not supported"),
        ({"input": "hi", "response_format": ["mp3"]}, "response_format",
         "must be a string, one of mp3, opus, aac, flac, wav, pcm; got a JSON list"),
        ({"input": "hi", "stream_format": "chunks"}, "stream_format", "choose one of audio, sse"),
        ({"input": "hi", "speed": 0.2}, "speed", "from 0.25 to 4.0"),
        ({"input": "hi", "speed": 4.5}, "speed", "from 0.25 to 4.0"),
        ({"input": "hi", "speed": True}, "speed", "got True"),
        ({"input": "hi", "speed": "fast"}, "speed", "got 'fast'"),
        ({"input": "hi", "instructions": 1}, "instructions", "must be a string"),
        ({"input": "hi", "model": 1}, "model", "must be a string"),
    ],
)
def test_parse_speech_refuses_naming_the_field(body: Any, field: str, words: str) -> None:
    error = speech_refusal(body)
    assert error.field == field and words in str(error) and str(error).startswith(f"'{field}'")


@pytest.mark.parametrize("text", ["\0" * 100, "\U0001F600" * 1000, "." * 4096], ids=["nuls", "emoji", "dots"])
def test_speech_with_nothing_speakable_is_400_naming_input_before_the_pipeline(text: str) -> None:
    """Issue 40 bug 7: 100 NULs, 1,000 emoji, 4,096 dots were a 200 audio/mpeg with an empty body."""
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [])
    client, _ = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": text})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    assert pipeline.submitted == []


def test_speech_takes_the_extension_fields_and_stream_true_is_the_sse_stream() -> None:
    """The fields vLLM's and SGLang's speech servers take were each a 400: they reach the TTS
    stage as the request's speech sampling (it honours or refuses them), and `stream: true`
    is the SSE stream."""
    request, _, sse, _, _ = parse_speech({"input": "Hi", "stream": True, "max_new_tokens": 64, "temperature": 0.7,
                                          "top_p": 0.9, "top_k": 20, "seed": 5})
    assert sse is True
    assert request.params() == {"speech_sampling": {"max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
                                                    "seed": 5}}
    assert parse_speech({"input": "Hi", "stream": False})[2] is False
    assert parse_speech({"input": "Hi"})[0].params() == {}  # nothing asked: nothing for the stage to refuse
    assert speech_refusal({"input": "Hi", "temperature": 3}).field == "temperature"
    assert speech_refusal({"input": "Hi", "max_new_tokens": 0}).field == "max_new_tokens"
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2))
    client, _ = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hello", "response_format": "pcm",
                                                                    "stream": True})
    assert [e["type"] for e in sse_events(response.text)][-1] == "speech.audio.done"


def test_a_speech_sampling_field_the_stage_refuses_is_400_under_the_clients_name() -> None:
    refusal = error_event("Piper cannot honour sampling.max_tokens", stage="speak", field="sampling.max_tokens")
    client, _ = serve(ScriptedPipeline(script=lambda inputs, modalities: [refusal]))
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "max_new_tokens": 9})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_new_tokens"


def test_a_non_finite_speed_is_refused() -> None:
    assert speech_refusal({"input": "hi", "speed": float("nan")}).field == "speed"
    assert speech_refusal({"input": "hi", "speed": float("inf")}).field == "speed"


def test_speech_streams_encoded_audio_and_flags_ignored_instructions() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(3))
    client, state = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH,
                           json={"input": "Hello.", "response_format": "pcm", "instructions": "warm"})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/pcm"
    assert response.headers[IGNORED_HEADER] == "instructions"
    [(inputs, modalities, *_)] = pipeline.submitted
    assert isinstance(inputs, SpeechRequest) and modalities == ["audio"]
    samples = np.frombuffer(response.content, "<i2")
    assert samples.size == 3 * 800 * 24_000 // 16_000  # three chunks, resampled to 24 kHz; the result not repeated
    assert state.active == {} and state.metrics.count("completed") == 1
    plain = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hello.", "response_format": "wav"})
    assert IGNORED_HEADER not in plain.headers and plain.content[:4] == b"RIFF"


def test_speech_skips_what_is_not_audio_counts_its_first_audio_and_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    from omnictl.outputs import TextDelta

    text = RequestEvent(RequestEventKind.STREAM, "answer", TextDelta("words"))
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [text] + audio_events(2))
    client, state = serve(pipeline)
    with caplog.at_level(logging.WARNING):
        response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "response_format": "pcm"})
    assert np.frombuffer(response.content, "<i2").size == 2 * 800 * 24_000 // 16_000
    assert "omnictl_time_to_first_audio_seconds_count 1.0" in state.metrics.exposition().decode()
    assert caplog.records == [] and state.metrics.count("completed") == 1


def test_a_failed_speech_request_is_logged_once_with_why(caplog: pytest.LogCaptureFixture) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [error_event("tts crashed", stage="speak")])
    client, _ = serve(pipeline)
    with caplog.at_level(logging.WARNING):
        client.post("/v1/audio/speech", headers={**AUTH, "X-Request-Id": "r-tts"}, json={"input": "Hi"})
    [line] = caplog.records
    assert line.getMessage() == "request r-tts failed: stage 'speak': tts crashed"


def test_speech_that_produces_no_audio_is_400_naming_input_and_a_model_is_checked() -> None:
    """Issue 40 bug 7: a text the voice made nothing of was a 200 with an empty body (no
    audio file at all, whatever the media type said)."""
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [])
    client, state = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "response_format": "mp3"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    assert "nothing the voice could speak" in response.json()["error"]["message"]
    assert state.metrics.count("rejected") == 1 and state.active == {}
    other = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "model": "other"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert len(pipeline.submitted) == 1


def test_speech_sends_the_result_when_nothing_streamed() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2)[-1:])  # the result alone
    client, _ = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "response_format": "pcm"})
    assert np.frombuffer(response.content, "<i2").size == 2 * 800 * 24_000 // 16_000


def test_speech_as_sse_is_deltas_and_done_with_its_usage() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2))
    client, state = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH,
                           json={"input": "Hello there", "response_format": "pcm", "stream_format": "sse"})
    events = sse_events(response.text)
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.done"]
    done = events[-1]
    assert done["usage"] == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "input_characters": 11,
                             "output_seconds": 0.1}
    assert done["seconds"] == 0.1
    assert state.metrics.count("completed") == 1 and state.active == {}


@pytest.mark.parametrize(
    ("event", "status", "code", "outcome"),
    [
        (error_event("no voice 'zed'", stage="speak", field="voice"), 400, "invalid_request", "rejected"),
        (error_event("tts crashed", stage="speak"), 500, "stage_failed", "failed"),
        (RequestEvent(RequestEventKind.ABORTED, None), 409, "aborted", "aborted"),
    ],
)
def test_speech_refused_before_its_first_audio_is_a_json_error(
    event: RequestEvent, status: int, code: str, outcome: str
) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [event])
    client, state = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "voice": "zed"})
    assert response.status_code == status
    message = f"stage 'speak': {event.error}" if event.error else "the request was aborted"
    kind = "invalid_request_error" if status == 400 else "server_error"
    assert response.json() == {"error": {"message": message, "type": kind, "code": code, "param": event.field}}
    assert state.metrics.count(outcome) == 1 and state.active == {}


def test_speech_ended_by_the_server_before_its_audio_is_503_saying_why() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    client, state = serve(pipeline)
    with client:
        client.portal.start_task_soon(end_in_flight_soon(state, pipeline, "the server is stopping"))  # type: ignore[union-attr]
        response = client.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi"})
    assert response.status_code == 503
    assert response.json() == {"error": {"message": "the server is stopping", "type": "server_error",
                                          "code": "server_shutdown", "param": None}}
    assert state.metrics.count("aborted") == 1 and state.active == {}


def test_speech_as_sse_in_a_compressed_format_sends_the_encoders_last_frames_too() -> None:
    from omnictl.serving.transcriptions.audiofile import decode_audio_file

    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(4))
    client, _ = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH,
                           json={"input": "Hello there", "response_format": "mp3", "stream_format": "sse"})
    deltas = [e for e in sse_events(response.text) if e["type"] == "speech.audio.delta"]
    mp3 = b"".join(base64.b64decode(d["audio"]) for d in deltas)
    samples, rate = decode_audio_file(mp3, "mp3", 60)
    assert samples.size / rate >= 0.2  # all four chunks: without the encoder's tail, ~0.1 s of them would be missing


@pytest.mark.parametrize(
    ("last", "error"),
    [
        (error_event("no voice 'zed'", stage="speak", field="voice"),
         {"message": "stage 'speak': no voice 'zed'", "type": "invalid_request_error", "code": "invalid_request",
          "param": "voice"}),
        (error_event("tts died", stage="speak"),
         {"message": "stage 'speak': tts died", "type": "server_error", "code": "stage_failed", "param": None}),
        (RequestEvent(RequestEventKind.ABORTED, None),
         {"message": "the request was aborted", "type": "server_error", "code": "aborted", "param": None}),
    ],
)
def test_speech_as_sse_ended_after_its_first_audio_closes_with_the_error(last: RequestEvent, error: dict[str, Any]) -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2)[:1] + [last])
    client, _ = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH,
                           json={"input": "Hi", "response_format": "pcm", "stream_format": "sse"})
    events = sse_events(response.text)
    assert events[0]["type"] == "speech.audio.delta" and base64.b64decode(events[0]["audio"])
    assert events[-1] == {"error": error}


def test_speech_failing_mid_stream_ends_the_stream_with_an_error_event() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2)[:1] + [error_event("tts died", "speak")])
    client, state = serve(pipeline)
    response = client.post("/v1/audio/speech", headers=AUTH,
                           json={"input": "Hi", "response_format": "pcm", "stream_format": "sse"})
    events = sse_events(response.text)
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["error"]["code"] == "stage_failed" and events[-1]["error"]["message"] == "stage 'speak': tts died"
    assert state.metrics.count("failed") == 1 and state.active == {}
    aborted = ScriptedPipeline(script=lambda inputs, modalities: audio_events(2)[:1], hold=True)
    client2, state2 = serve(aborted)

    async def abort_soon() -> None:
        import asyncio

        while not aborted.requests:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        await aborted.abort(next(iter(aborted.requests)))

    with client2:
        client2.portal.start_task_soon(abort_soon)  # type: ignore[union-attr]
        raw = client2.post("/v1/audio/speech", headers=AUTH, json={"input": "Hi", "response_format": "pcm"})
    assert raw.status_code == 200 and len(raw.content) > 0  # the bytes so far, then the body ends
    assert state2.metrics.count("aborted") == 1 and state2.active == {}


# --- transcriptions ---------------------------------------------------------------------


SEGMENTS = [
    TranscriptSegment(id=0, start=0.0, end=1.5, text=" Hello there.", words=[TranscriptWord("Hello", 0.0, 0.5, 0.9),
                                                                             TranscriptWord("there.", 0.6, 1.5, 0.5)]),
    TranscriptSegment(id=1, start=3661.25, end=3662.0, text=" Bye.", words=[TranscriptWord("Bye.", 3661.25, 3662.0, 1.0)]),
]
HEARD = Transcript(text="Hello there. Bye.", language="en", duration=3662.0, segments=SEGMENTS)


def heard(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
    return [RequestEvent(RequestEventKind.RESULT, "hear", HEARD)]


def transcribe(client: TestClient, path: str = "/v1/audio/transcriptions", **fields: Any) -> Any:
    data = {k: v for k, v in fields.items()}
    return client.post(path, headers=AUTH, files={"file": ("a.wav", wav_bytes(tone(0.1)), "audio/wav")}, data=data)


def test_a_transcription_reaches_the_pipeline_as_audio_for_the_transcript_alone() -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, state = serve(pipeline)
    response = transcribe(client, language="en", model="m")
    assert response.status_code == 200
    assert response.json() == {"text": HEARD.text, "usage": {"type": "duration", "seconds": 3662.0}}
    [(inputs, modalities, *_)] = pipeline.submitted
    assert modalities == ["transcript"] and inputs.language == "en" and inputs.recognition is None
    [audio] = inputs.last_user_message().audio()
    assert audio.samples.size == 1600 and audio.sample_rate == 16_000
    assert state.metrics.count("completed") == 1 and state.active == {}


def test_the_options_that_reach_the_recognizer() -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, _ = serve(pipeline)
    transcribe(client, response_format="verbose_json", **{"timestamp_granularities[]": "word"}, prompt="names",
               temperature="0.5")
    options = pipeline.submitted[-1][0].recognition
    assert (options.task, options.prompt, options.temperature, options.timestamps, options.words, options.stream) == (
        "transcribe", "names", 0.5, True, True, False)
    transcribe(client, "/v1/audio/translations")
    options = pipeline.submitted[-1][0].recognition
    assert options.task == "translate" and not options.timestamps and not options.words
    transcribe(client, temperature="")
    assert pipeline.submitted[-1][0].recognition is None


def test_each_response_format() -> None:
    client, _ = serve(ScriptedPipeline(script=heard))
    text = transcribe(client, response_format="text")
    assert text.text == HEARD.text and text.headers["content-type"].startswith("text/plain")
    subrip = transcribe(client, response_format="srt")
    assert subrip.headers["content-type"].startswith("application/x-subrip") and subrip.text == srt(SEGMENTS)
    webvtt = transcribe(client, response_format="vtt")
    assert webvtt.headers["content-type"].startswith("text/vtt") and webvtt.text == vtt(SEGMENTS)
    verbose = transcribe(client, response_format="verbose_json", **{"timestamp_granularities[]": ["word", "segment"]}).json()
    assert verbose["task"] == "transcribe" and verbose["language"] == "en" and verbose["duration"] == 3662.0
    assert [s["seek"] for s in verbose["segments"]] == [0, 366125]
    assert verbose["segments"][1] == {"id": 1, "seek": 366125, "start": 3661.25, "end": 3662.0, "text": " Bye.",
                                      "tokens": [], "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0,
                                      "no_speech_prob": 0.0}
    assert verbose["words"][0] == {"word": "Hello", "start": 0.0, "end": 0.5}
    assert verbose["usage"] == {"type": "duration", "seconds": 3662.0}
    translated = transcribe(client, "/v1/audio/translations", response_format="verbose_json").json()
    assert translated["task"] == "translate" and "usage" not in translated and "words" not in translated
    assert transcribe(client, "/v1/audio/translations").json() == {"text": HEARD.text}
    logprobs = transcribe(client, **{"include[]": "logprobs"}).json()["logprobs"]
    assert [p["token"] for p in logprobs] == ["Hello", "there.", "Bye."]
    assert logprobs[0]["logprob"] == pytest.approx(np.log(0.9)) and logprobs[2]["logprob"] == 0.0
    assert logprobs[1]["bytes"] == list(b"there.")


def test_subtitles_timestamps() -> None:
    assert srt(SEGMENTS) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                             "2\n01:01:01,250 --> 01:01:02,000\nBye.\n")
    assert vtt(SEGMENTS) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                             "01:01:01.250 --> 01:01:02.000\nBye.\n")
    assert srt([TranscriptSegment(id=0, start=-0.2, end=0.0004, text="x")]) == "1\n00:00:00,000 --> 00:00:00,000\nx\n"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"response_format": "docx"}, "response_format",
         "'response_format' 'docx' is not supported; choose one of json, text, verbose_json, srt, vtt"),
        ({"stream": "yes"}, "stream", "'stream' must be true or false, got 'yes'"),
        ({"stream": "true", "response_format": "srt"}, "stream",
         "'stream' streams text events; it cannot stream response_format 'srt' (use json or text)"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities[]",
         "'timestamp_granularities[]' needs response_format 'verbose_json' (as OpenAI's)"),
        ({"timestamp_granularities[]": "phrase", "response_format": "verbose_json"}, "timestamp_granularities[]",
         "'timestamp_granularities[]' 'phrase' is not supported; choose from segment, word"),
        ({"include[]": "logprobs", "response_format": "text"}, "include[]",
         "'include[]' 'logprobs' needs response_format 'json' (as OpenAI's)"),
        ({"chunking_strategy": "server_vad"}, "chunking_strategy",
         "'chunking_strategy' only 'auto' is supported (Whisper's own 30 s windows), got 'server_vad'"),
        ({"temperature": "hot"}, "temperature", "'temperature' must be a number from 0 to 1, got 'hot'"),
        ({"temperature": "1.5"}, "temperature", "'temperature' must be a number from 0 to 1, got '1.5'"),
        ({"temperature": "-0.1"}, "temperature", "'temperature' must be a number from 0 to 1, got '-0.1'"),
        ({"temperature": "nan"}, "temperature", "'temperature' must be a number from 0 to 1, got 'nan'"),
        ({"known_speaker_names[]": "ann"}, "known_speaker_names[]",
         "'known_speaker_names[]' is not supported: Whisper does not tell speakers apart (no diarization)"),
        ({"voice": "x"}, "voice", "'voice' is not a field of this endpoint (it reads chunking_strategy, file, include[], "
         "language, model, prompt, response_format, stream, temperature, timestamp_granularities[])"),
        ({"model": ["a", "b"]}, "model", "'model' is given more than once"),
    ],
)
def test_form_refusals_name_the_field(fields: dict[str, Any], field: str, message: str) -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, state = serve(pipeline)
    response = transcribe(client, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["message"]) == (field, message)
    assert pipeline.submitted == [] and state.metrics.count("rejected") == 1


@pytest.mark.parametrize(
    ("fields", "options"),
    [
        ({"temperature": "1"}, {"temperature": 1.0}),  # the bounds are in range
        ({"temperature": "0"}, {"temperature": 0.0}),
        ({"stream": "TRUE", "response_format": "text"}, {"stream": True}),  # any case; text streams
        ({"stream": "False"}, {"stream": False}),
        ({"response_format": "srt"}, {"timestamps": True}),  # subtitles need the segments' times
        ({"response_format": "vtt"}, {"timestamps": True}),
        ({"response_format": "verbose_json"}, {"timestamps": True}),
        ({"response_format": "text"}, {"timestamps": False}),
        ({"include": "logprobs"}, {"words": True}),  # a list field's name without its brackets
    ],
)
def test_form_values_at_their_edges_are_taken(fields: dict[str, Any], options: dict[str, Any]) -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, _ = serve(pipeline)
    response = transcribe(client, **fields)
    assert response.status_code == 200, response.text
    recognition = pipeline.submitted[0][0].recognition
    if recognition is None:  # nothing asked of the recognizer beyond its defaults
        assert not any(options.values()), options
        return
    assert {key: getattr(recognition, key) for key in options} == options


def test_translations_take_fewer_fields() -> None:
    client, _ = serve(ScriptedPipeline(script=heard))
    for key in ("language", "stream", "known_speaker_names[]"):
        response = transcribe(client, "/v1/audio/translations", **{key: "x"})
        assert response.status_code == 400 and response.json()["error"]["param"] == key
        assert "is not a field of this endpoint" in response.json()["error"]["message"]


def test_the_file_must_be_there_readable_and_within_the_limits() -> None:
    client, _ = serve(ScriptedPipeline(script=heard), limits=Limits(max_audio_bytes=1000))
    missing = client.post("/v1/audio/transcriptions", headers=AUTH, files={"model": (None, "m")})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "file"
    assert "is missing" in missing.json()["error"]["message"]
    big = transcribe(client)
    assert big.status_code == 413 and big.json()["error"]["param"] == "file"
    assert "the limit is 1000" in big.json()["error"]["message"]
    client2, _ = serve(ScriptedPipeline(script=heard))
    garbage = client2.post("/v1/audio/transcriptions", headers=AUTH, files={"file": ("a.wav", b"RIFF0000WAVEjunk")})
    assert garbage.status_code == 400 and garbage.json()["error"]["param"] == "file"
    not_multipart = client2.post("/v1/audio/transcriptions", headers={**AUTH, "Content-Type": "application/json"},
                                 content=b"{}")
    assert not_multipart.status_code == 415


def test_a_streamed_transcription_is_a_delta_per_segment_then_done() -> None:
    def streamed(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        first = Transcript(text=" Hello there.", segments=[SEGMENTS[0]])
        return [RequestEvent(RequestEventKind.STREAM, "hear", first),
                RequestEvent(RequestEventKind.STREAM, "hear", first),  # a repeat is not sent twice
                RequestEvent(RequestEventKind.RESULT, "hear", HEARD)]  # the last segment came only with the result

    pipeline = ScriptedPipeline(script=streamed)
    client, state = serve(pipeline)
    response = transcribe(client, stream="true", **{"include[]": "logprobs"})
    events = sse_events(response.text)
    assert [e["type"] for e in events] == ["transcript.text.delta", "transcript.text.delta", "transcript.text.done"]
    assert events[0]["delta"] == "Hello there." and events[1]["delta"] == " Bye."  # the first one's space stripped
    assert [p["token"] for p in events[0]["logprobs"]] == ["Hello", "there."]
    assert events[2]["text"] == HEARD.text and len(events[2]["logprobs"]) == 3
    options = pipeline.submitted[0][0].recognition
    assert options.stream and options.timestamps
    assert state.metrics.count("completed") == 1 and state.active == {}


def test_a_streamed_transcription_that_fails_or_ends_without_a_result() -> None:
    def fails(inputs: Any, modalities: list[str]) -> list[RequestEvent]:
        return [RequestEvent(RequestEventKind.STREAM, "hear", Transcript(text="a", segments=[SEGMENTS[0]])),
                error_event("asr crashed", stage="hear")]

    client, state = serve(ScriptedPipeline(script=fails))
    events = sse_events(transcribe(client, stream="true").text)
    assert events[-1]["error"]["code"] == "stage_failed" and events[-1]["error"]["message"] == "stage 'hear': asr crashed"
    assert state.metrics.count("failed") == 1
    ends = ScriptedPipeline(script=lambda inputs, modalities: [
        RequestEvent(RequestEventKind.STREAM, "hear", Transcript(text="a", segments=[SEGMENTS[0]]))])
    client2, state2 = serve(ends)
    events = sse_events(transcribe(client2, stream="true").text)
    assert events[-1]["error"]["message"] == "the recognizer ended without a result"
    assert state2.metrics.count("failed") == 1 and state2.active == {}


def test_a_streamed_transcription_ended_mid_way_says_how_in_its_last_event(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="omnictl.serving")
    started = RequestEvent(RequestEventKind.STREAM, "hear", Transcript(text=" a", segments=[SEGMENTS[0]]))
    cases = {
        "failed": (error_event("asr crashed", stage="hear"),
                   {"type": "server_error", "code": "stage_failed", "param": None, "message": "stage 'hear': asr crashed"}),
        "rejected": (error_event("the language 'xx' is not known", stage="hear", field="language"),
                     {"type": "invalid_request_error", "code": "invalid_request", "param": "language"}),
        "aborted": (RequestEvent(RequestEventKind.ABORTED, None),
                    {"type": "server_error", "code": "aborted", "param": None, "message": "the request was aborted"}),
    }
    for outcome, (last, error) in cases.items():
        caplog.clear()
        client, state = serve(ScriptedPipeline(script=lambda inputs, modalities, last=last: [started, last]))
        events = sse_events(transcribe(client, stream="true").text)
        assert [e["type"] for e in events[:-1]] == ["transcript.text.delta"], events
        assert events[0]["delta"] == SEGMENTS[0].text.lstrip()
        assert {k: events[-1]["error"][k] for k in error} == error, events[-1]
        assert state.metrics.count(outcome) == 1 and state.active == {}
        if outcome == "failed":  # logged once, with the stage's own words
            [line] = [r.getMessage() for r in caplog.records if " failed: " in r.getMessage()]
            assert line.endswith(" failed: asr crashed"), line


@pytest.mark.parametrize("stream", ["true", "false"])
@pytest.mark.parametrize(
    ("event", "status", "code", "outcome"),
    [
        (error_event("not speech", stage="hear", field="file"), 400, "invalid_request", "rejected"),
        (error_event("asr crashed", stage="hear"), 500, "stage_failed", "failed"),
        (RequestEvent(RequestEventKind.ABORTED, None), 409, "aborted", "aborted"),
    ],
)
def test_a_transcription_refused_before_any_text_is_a_json_error(
    stream: str, event: RequestEvent, status: int, code: str, outcome: str
) -> None:
    client, state = serve(ScriptedPipeline(script=lambda inputs, modalities: [event]))
    response = transcribe(client, stream=stream)
    assert response.status_code == status and response.json()["error"]["code"] == code
    if event.field:
        assert response.json()["error"]["param"] == "file"
    assert state.metrics.count(outcome) == 1 and state.active == {}


def test_a_form_that_cannot_be_read_or_holds_a_file_where_text_belongs() -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, _ = serve(pipeline)
    no_boundary = client.post("/v1/audio/transcriptions", headers={**AUTH, "Content-Type": "multipart/form-data"},
                              content=b"--x\r\n\r\n")
    assert no_boundary.status_code == 400 and no_boundary.json()["error"]["param"] == "body"
    assert "is not a readable multipart form" in no_boundary.json()["error"]["message"]
    as_file = client.post("/v1/audio/transcriptions", headers=AUTH, files={"prompt": ("p.txt", b"names")})
    assert as_file.status_code == 400 and as_file.json()["error"]["param"] == "prompt"
    assert "must be a plain form field" in as_file.json()["error"]["message"]
    bad_language = transcribe(client, language="english!")
    assert bad_language.status_code == 400 and bad_language.json()["error"]["param"] == "language"
    assert bad_language.json()["error"]["message"].startswith("'language' must be a language code")
    assert pipeline.submitted == []


def test_a_large_file_is_decoded_off_the_loop_and_reaches_the_pipeline_whole() -> None:
    pipeline = ScriptedPipeline(script=heard)
    client, _ = serve(pipeline)
    samples = tone(64 * 1024 / 2 / 16_000 + 0.5)  # a WAV over the size once decoded on the loop
    response = client.post("/v1/audio/transcriptions", headers=AUTH,
                           files={"file": ("a.wav", wav_bytes(samples), "audio/wav")})
    assert response.status_code == 200
    [audio] = pipeline.submitted[0][0].last_user_message().audio()
    assert audio.samples.size == samples.size


def test_a_transcription_ended_by_the_server_is_503_saying_why() -> None:
    pipeline = ScriptedPipeline(script=lambda inputs, modalities: [], hold=True)
    client, state = serve(pipeline)
    with client:
        client.portal.start_task_soon(end_in_flight_soon(state, pipeline, "the server is stopping"))  # type: ignore[union-attr]
        response = transcribe(client, stream="true")
    assert response.status_code == 503 and response.json()["error"]["message"] == "the server is stopping"
    assert response.json()["error"]["code"] == "server_shutdown" and state.active == {}
