"""OpenAI audio parity against a real `omnictl serve` of the voice assistant (real Piper,
real Whisper), through the official `openai` client: every speech format, streamed speech,
speed, chat's audio formats; transcriptions of what browsers and phones record, streamed,
with timestamps, as SRT and VTT; translations; bad input refused fast, nothing held."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from omnictl.inputs import read_wav
from benchmarks.eval.samples import sample_path
from omnictl.serving.speech.encode import encode_whole
from omnictl.serving.transcriptions.audiofile import decode_audio_file
from tests.serving.ffprobe import CODEC_NAMES, convert, needs_ffmpeg, probe
from tests.serving.harness import API_KEY, ServerProcess, wait_until
from tests.serving.test_app import audio_of
from tests.serving.transcriptions.test_audiofile import claims_hours

pytestmark = [pytest.mark.slow, needs_ffmpeg]
SENTENCE = "The quick brown fox jumps over the lazy dog."
STORY = "The sky is blue today. The fox runs into the forest. It rains in the evening. The dog sleeps by the fire."
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture()
def client(voice_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=voice_server.url + "/v1", api_key=API_KEY, timeout=120, max_retries=0)


def heard(whisper: Any, data: bytes) -> str:
    samples, rate = decode_audio_file(data, "file", 600)
    return str(whisper.transcribe(samples, rate)).lower()


def wav_seconds(data: bytes) -> float:
    samples, rate = read_wav(data)
    return samples.size / rate


def nothing_held(server: ServerProcess) -> None:
    def idle() -> bool:
        health = httpx.get(server.url + "/health", headers=AUTH, timeout=30).json()
        return health["in_flight"] == 0 and health["pipeline_in_flight"] == 0
    wait_until(idle, timeout=30)


# --- speech ------------------------------------------------------------------------------


def test_every_speech_format_decodes_to_its_codec_and_says_the_input(client: openai.OpenAI, whisper: Any) -> None:
    wav = client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE, response_format="wav")
    reference = wav_seconds(wav.content)
    for fmt in ("mp3", "opus", "aac", "flac"):
        response = client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE,
                                              response_format=fmt)  # type: ignore[arg-type]
        codec, seconds = probe(response.content)
        assert codec == CODEC_NAMES[fmt]
        # Each request is synthesized anew and Piper varies phoneme lengths at random (a few
        # percent); the encoders themselves keep the length within 5% (test_audio_codecs).
        assert seconds == pytest.approx(reference, rel=0.1), (fmt, seconds, reference)
        text = heard(whisper, response.content)
        assert "fox" in text and "dog" in text, (fmt, text)
    pcm = client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE, response_format="pcm")
    assert len(pcm.content) / 2 / 24_000 == pytest.approx(reference, rel=0.1)
    samples = np.frombuffer(pcm.content, "<i2").astype(np.float32) / 32768.0
    assert "fox" in whisper.transcribe(samples, 24_000).lower()


def test_omitting_response_format_gives_mp3_as_openai_does(client: openai.OpenAI) -> None:
    response = client.audio.speech.create(model="voice-assistant", voice="alloy", input="Hello there.")
    assert response.response.headers["content-type"] == "audio/mpeg" and probe(response.content)[0] == "mp3"


def test_a_streamed_mp3_starts_before_synthesis_ends(client: openai.OpenAI) -> None:
    arrivals: list[tuple[float, int]] = []
    pieces: list[bytes] = []
    started = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(
            model="voice-assistant", voice="alloy", input=STORY, response_format="mp3") as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        for piece in response.iter_bytes():
            arrivals.append((time.perf_counter() - started, len(piece)))
            pieces.append(piece)
    total = arrivals[-1][0]
    first = arrivals[0][0]
    assert len(arrivals) >= 3, arrivals  # one burst per sentence at least, not one body
    # Four sentences are synthesized one after another: the first bytes come while the
    # later sentences are still being spoken.
    assert total - first > 0.25 * total, arrivals
    assert probe(b"".join(pieces))[0] == "mp3"


def test_speech_as_sse_events_with_usage(voice_server: ServerProcess, whisper: Any) -> None:
    body = {"model": "voice-assistant", "input": STORY, "response_format": "mp3", "stream_format": "sse"}
    with httpx.stream("POST", voice_server.url + "/v1/audio/speech", json=body, headers=AUTH, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas, done = events[:-1], events[-1]
    assert len(deltas) >= 4 and all(e["type"] == "speech.audio.delta" and set(e) == {"type", "audio"} for e in deltas)
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_characters"] == len(STORY) and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    mp3 = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    codec, seconds = probe(mp3)
    assert codec == "mp3" and seconds == pytest.approx(usage["output_seconds"], rel=0.05)
    text = heard(whisper, mp3)
    assert "fox" in text and "dog" in text, text


def test_speed_is_applied_by_the_tts(client: openai.OpenAI) -> None:
    normal = wav_seconds(client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE,
                                                    response_format="wav").content)
    fast = wav_seconds(client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE,
                                                  response_format="wav", speed=2.0).content)
    slow = wav_seconds(client.audio.speech.create(model="voice-assistant", voice="alloy", input=SENTENCE,
                                                  response_format="wav", speed=0.5).content)
    assert fast < 0.7 * normal and slow > 1.5 * normal, (fast, normal, slow)
    for speed in (0.1, 4.5):
        with pytest.raises(openai.BadRequestError) as error:
            client.audio.speech.create(model="voice-assistant", voice="alloy", input="hi", speed=speed)
        assert error.value.body["param"] == "speed"


def test_instructions_are_accepted_and_the_response_says_they_are_not_followed(client: openai.OpenAI) -> None:
    response = client.audio.speech.with_raw_response.create(model="voice-assistant", voice="alloy", input="Hello.",
                                                            response_format="wav", instructions="Speak cheerfully.")
    assert response.status_code == 200 and response.headers["x-omnictl-ignored"] == "instructions"
    assert wav_seconds(response.content) > 0.3


def test_bad_speech_fields_are_json_400s_naming_them(voice_server: ServerProcess) -> None:
    url = voice_server.url + "/v1/audio/speech"
    for body, field in (({"input": "hi", "response_format": ["mp3"]}, "response_format"),
                        ({"input": "hi", "response_format": {"type": "mp3"}}, "response_format"),
                        ({"input": "hi", "stream_format": ["sse"]}, "stream_format"),
                        ({"input": "hi", "voice": "nobody"}, "voice")):
        response = httpx.post(url, json=body, headers=AUTH, timeout=60)
        assert response.status_code == 400 and response.headers["content-type"] == "application/json", response.text
        assert response.json()["error"]["param"] == field, response.text
    assert "joe" in httpx.post(url, json={"input": "hi", "voice": "nobody"}, headers=AUTH, timeout=60).json()["error"]["message"]
    nothing_held(voice_server)


def test_chat_audio_takes_the_same_formats(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="voice-assistant", modalities=["text", "audio"], audio={"voice": "alloy", "format": "opus"},
        messages=[{"role": "user", "content": "What colour is the sky?"}], stream=True)
    audio = [audio_of(chunk.choices[0].delta) for chunk in stream if chunk.choices]
    pieces = [base64.b64decode(part["data"]) for part in audio if part]
    assert len(pieces) >= 2  # the sentence as spoken, then what the encoder held at the end
    codec, seconds = probe(b"".join(pieces))
    assert codec == "opus" and seconds > 0.5
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="voice-assistant", modalities=["text", "audio"],
                                       audio={"voice": "alloy", "format": "ogg"},  # type: ignore[typeddict-item]
                                       messages=[{"role": "user", "content": "hi"}])
    assert error.value.body["param"] == "audio.format"


# --- transcriptions ----------------------------------------------------------------------

QUESTION = sample_path("spider_legs").read_bytes()


@pytest.mark.parametrize("suffix,args", [("wav", ()), ("mp3", ()), ("ogg", ("-c:a", "libopus")), ("webm", ())])
def test_the_same_question_recorded_in_each_format_is_heard(client: openai.OpenAI, suffix: str,
                                                            args: tuple[str, ...]) -> None:
    data = QUESTION if suffix == "wav" else convert(QUESTION, suffix, *args)
    text = client.audio.transcriptions.create(model="voice-assistant", file=(f"q.{suffix}", data)).text.lower()
    assert "spider" in text and "legs" in text, (suffix, text)


def three_questions() -> tuple[bytes, float]:
    """Three spoken questions with pauses between: Whisper decodes them as several segments."""
    parts = []
    for name in ("spider_legs", "capital_of_france", "sky_colour"):
        samples, rate = read_wav(sample_path(name).read_bytes())
        parts += [samples, np.zeros(int(rate * 1.5), np.float32)]
    clip = np.concatenate(parts)
    return encode_whole(clip, rate, "wav"), clip.size / rate


def test_streamed_deltas_arrive_per_segment_and_add_up_to_the_text(client: openai.OpenAI) -> None:
    data, _ = three_questions()
    stream = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", data), stream=True)
    events = list(stream)
    deltas, done = events[:-1], events[-1]
    assert all(isinstance(e, TranscriptionTextDeltaEvent) for e in deltas) and len(deltas) >= 2, events
    assert isinstance(done, TranscriptionTextDoneEvent)
    assert "".join(e.delta for e in deltas) == done.text
    text = done.text.lower()
    assert "spider" in text and "france" in text and "sky" in text, text


def test_word_and_segment_timestamps(client: openai.OpenAI) -> None:
    data, seconds = three_questions()
    verbose = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", data),
                                                 response_format="verbose_json",
                                                 timestamp_granularities=["word", "segment"])
    assert verbose.duration == pytest.approx(seconds, abs=0.01)
    words, segments = verbose.words or [], verbose.segments or []
    assert len(words) >= 12 and len(segments) >= 2
    for items in (words, segments):
        starts = [item.start for item in items]
        assert starts == sorted(starts), starts
        assert all(0 <= item.start <= item.end <= seconds + 0.05 for item in items)
    assert "spider" in " ".join(w.word.lower() for w in words)


_SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.+)\n")
_VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n(.+)\n")


def _seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def test_srt_and_vtt_parse(client: openai.OpenAI) -> None:
    data, seconds = three_questions()
    srt = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", data), response_format="srt")
    cues = _SRT_CUE.findall(str(srt))
    assert len(cues) >= 2 and [int(c[0]) for c in cues] == list(range(1, len(cues) + 1)), srt
    assert "".join(m.group(0) for m in _SRT_CUE.finditer(str(srt))).replace("\n", "") == str(srt).replace("\n", "")
    for cue in cues:
        assert 0 <= _seconds(*cue[1:5]) <= _seconds(*cue[5:9]) <= seconds + 0.05
    vtt = str(client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", data), response_format="vtt"))
    assert vtt.startswith("WEBVTT\n\n")
    vtt_cues = _VTT_CUE.findall(vtt)
    assert len(vtt_cues) == len(cues) and "spider" in vtt.lower()


def test_prompt_temperature_language_and_logprobs_are_accepted(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(model="voice-assistant", file=("q.wav", QUESTION), language="en",
                                                prompt="A question about spiders.", temperature=0.0,
                                                include=["logprobs"])
    assert "spider" in result.text.lower()
    logprobs = result.logprobs or []
    assert logprobs and all(p.logprob is not None and p.logprob <= 0 for p in logprobs)
    assert "".join(p.token or "" for p in logprobs).strip() == result.text


def test_bad_transcription_input_is_refused_fast_naming_the_field(voice_server: ServerProcess) -> None:
    url = voice_server.url + "/v1/audio/transcriptions"
    mp3 = convert(QUESTION, "mp3")
    cases = [
        ({"file": ("q.mp3", b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 20)}, {}, 400, "file"),  # corrupt
        ({"file": ("q.wav", QUESTION)}, {"language": "xx"}, 400, "language"),
        ({"file": ("q.mp3", claims_hours(mp3))}, {}, 413, "file"),  # its header claims days
        ({"file": ("q.wav", QUESTION)}, {"response_format": "docx"}, 400, "response_format"),
        ({"file": ("q.wav", QUESTION)}, {"timestamp_granularities[]": "word"}, 400, "timestamp_granularities[]"),
        ({"file": ("q.wav", QUESTION)}, {"known_speaker_names[]": "ann"}, 400, "known_speaker_names[]"),
        ({"file": ("q.wav", QUESTION)}, {"stream": "true", "response_format": "srt"}, 400, "stream"),
    ]
    for files, data, status, field in cases:
        started = time.perf_counter()
        response = httpx.post(url, files=files, data={"model": "voice-assistant", **data}, headers=AUTH, timeout=60)
        took = time.perf_counter() - started
        assert response.status_code == status and response.json()["error"]["param"] == field, response.text
        if field != "language":  # refused before the pipeline: no model runs
            assert took < 0.5, (field, took)
        else:  # the recognizer's check: the client's mistake, not where the server found it
            message = response.json()["error"]["message"]
            assert "'xx'" in message and "(at " not in message, message
    nothing_held(voice_server)


# --- translations ------------------------------------------------------------------------


# Recorded once and committed, so every machine hears the same audio: espeak-ng 1.51
# (`espeak-ng -v de -s 130 "Guten Morgen. Ich möchte eine Tasse Kaffee, bitte."`; French:
# "Bonjour. Je voudrais un café, s'il vous plaît."), as 16 kHz FLAC. Chosen with margin:
# Whisper base translates each into English with a beam of 5 and greedily, with and without
# timestamps, at an average log-probability near -0.6 (-1.0 is where Whisper gives up a
# decode). How well translation goes on speech made afresh is a figure, not an assertion:
# benchmarks/translation_quality.py prints it.
RECORDED = Path(__file__).resolve().parent / "recorded"


def recorded(language: str) -> bytes:
    return (RECORDED / f"coffee_{language}.flac").read_bytes()


@pytest.mark.parametrize("language", ["de", "fr"])
def test_a_recorded_question_in_german_or_french_comes_back_in_english(client: openai.OpenAI, language: str) -> None:
    result = client.audio.translations.create(model="voice-assistant", file=(f"q_{language}.flac", recorded(language)))
    text = result.text.lower()
    assert "morning" in text and "coffee" in text, text
    verbose = client.audio.translations.create(model="voice-assistant", file=(f"q_{language}.flac", recorded(language)),
                                               response_format="verbose_json")
    assert verbose.model_extra["task"] == "translate", verbose
    assert verbose.language == language, verbose  # the language Whisper heard: what it translated from
    assert "coffee" in verbose.text.lower() and verbose.segments


def test_a_translation_request_tells_the_decoder_to_translate(whisper: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism, in this process: a /v1/audio/translations form becomes options whose
    decode puts Whisper's <|translate|> task token in the decoder's prompt, after the
    language token it detected (a request does not name one); a transcription's prompt has
    <|transcribe|> instead. The prompt is the one faster-whisper builds and decodes with."""
    from starlette.datastructures import FormData

    from omnictl.serving.transcriptions.route import _options

    prompts: list[list[int]] = []
    build = whisper.model.get_prompt

    def recording(*args: Any, **kwargs: Any) -> list[int]:
        prompt = build(*args, **kwargs)
        prompts.append(list(prompt))
        return prompt

    monkeypatch.setattr(whisper.model, "get_prompt", recording)  # the real prompt, recorded on its way
    samples, rate = decode_audio_file(recorded("de"), "file", 600)
    names = whisper.model.hf_tokenizer.id_to_token
    for task, expected, other in (("translate", "<|translate|>", "<|transcribe|>"),
                                  ("transcribe", "<|transcribe|>", "<|translate|>")):
        # verbose_json: a transcription then decodes with options too (a plain one takes the short path)
        _, options, language = _options(FormData({"model": "voice-assistant", "response_format": "verbose_json"}), task)
        assert options is not None and options.task == task
        prompts.clear()
        segments, heard = whisper.decode(samples, rate, language or ("de" if task == "transcribe" else None), options)
        text = "".join(segment.text for segment in segments).lower()
        assert heard == "de" and prompts, (task, heard)
        tokens = [names(token) for token in prompts[0]]
        assert expected in tokens and other not in tokens, tokens
        assert tokens.index("<|de|>") + 1 == tokens.index(expected), tokens  # <|de|><|translate|>: from German
        assert ("coffee" in text) == (task == "translate"), text  # and the words follow: English, or German kept


def test_translations_refuse_transcription_only_fields(voice_server: ServerProcess) -> None:
    response = httpx.post(voice_server.url + "/v1/audio/translations", files={"file": ("q.wav", QUESTION)},
                          data={"language": "fr"}, headers=AUTH, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "language"


# --- voices ------------------------------------------------------------------------------


def test_voices_lists_what_voice_accepts(voice_server: ServerProcess, server: ServerProcess) -> None:
    listed = httpx.get(voice_server.url + "/v1/audio/voices", headers=AUTH, timeout=30)
    assert listed.status_code == 200, listed.text
    body = listed.json()
    names = [voice["id"] for voice in body["data"]]
    assert names == ["joe"] and "alloy" in body["aliases"]
    for name in names + ["alloy"]:  # each listed name is accepted
        spoken = httpx.post(voice_server.url + "/v1/audio/speech", headers=AUTH, timeout=60,
                            json={"input": "Hi.", "voice": name, "response_format": "wav"})
        assert spoken.status_code == 200 and wav_seconds(spoken.content) > 0.2
    assert httpx.get(voice_server.url + "/v1/audio/voices", timeout=30).status_code == 401  # behind the key
    # The fast topology's audio terminal does not list voices: it says so.
    assert httpx.get(server.url + "/v1/audio/voices", headers=AUTH, timeout=30).status_code == 404
