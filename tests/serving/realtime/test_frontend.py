"""One realtime session's audio front end (:mod:`omnictl.serving.realtime.frontend`): the 16 kHz
stream the VAD hears is the same whatever sizes the appends had, the VAD's clock keeps to the
audio appended, G.711 appends decode as one stream, and an append with no audio is a no-op."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from benchmarks.realtime_turn_detection import question
from omnictl.audio import float_to_pcm16_bytes
from omnictl.inputs import PCM16_RATE
from omnictl.serving.app import create_app
from omnictl.serving.realtime.formats import CODECS, alaw_encode, ulaw_encode
from omnictl.serving.realtime.frontend import AudioFrontEnd, SpeechFrontEnd
from omnictl.serving.realtime.smart_turn import SemanticTurnDetector
from omnictl.serving.realtime.vad import FRAME, VAD_RATE, SileroModel, SileroVad, TurnDetector, VadSettings
from omnictl.serving.state import ServingState
from tests.serving.scripted import ScriptedPipeline

FRAME_MS = FRAME * 1000 / VAD_RATE


class QuietModel:
    """A test double for Silero alone: every frame is silence (the timeline test counts frames)."""

    frames = 0

    def run(self, frame: np.ndarray, context: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[float, Any, Any]:
        assert frame.size == FRAME
        self.frames += 1
        return 0.0, h, c


def odd_sizes(total: int) -> list[int]:
    """Appends of 1, 1,001 and 4,799 samples in turn, ``total`` samples in all."""
    sizes, cycle, left = [], (1, 1_001, 4_799), total
    while left > 0:
        sizes.append(min(cycle[len(sizes) % 3], left))
        left -= sizes[-1]
    return sizes


@pytest.fixture(scope="module")
def silero() -> SileroModel:
    return SileroModel()


def test_ten_minutes_of_odd_appends_keep_the_vad_s_clock_within_a_frame() -> None:
    """Each append resampled alone gave one 16 kHz sample per one-sample append (1.5x on the
    clock) and rounded every other's length: 64 ms behind after 10 minutes of these appends
    (18,748 frames), and further with more of them. One stream: the frames counted are the
    audio appended."""
    seconds = 600
    sizes = odd_sizes(seconds * PCM16_RATE)
    model = QuietModel()
    turns = TurnDetector(VadSettings())
    front = SpeechFrontEnd(model, turns)  # type: ignore[arg-type]  # the double has SileroModel's run
    old_api = SileroVad(model, PCM16_RATE)  # type: ignore[arg-type]  # fed 24 kHz itself: the same clock
    quiet = bytes(2 * max(sizes))
    old_frames = 0
    for size in sizes:
        front.hear(quiet[: 2 * size])
        old_frames += len(old_api.feed(np.zeros(size, np.float32)))
    appended_ms = seconds * 1000
    # never ahead of the audio, behind it by less than the frame not yet complete
    assert 0 <= appended_ms - turns.frames * FRAME_MS <= FRAME_MS, turns.frames
    assert 0 <= appended_ms - old_frames * FRAME_MS <= FRAME_MS, old_frames
    assert abs(front.heard_ms - appended_ms) < 1  # the 16 kHz stream: under a millisecond behind


def speech_events(silero: SileroModel, audio: np.ndarray, sizes: list[int]) -> tuple[list[object], np.ndarray]:
    front = SpeechFrontEnd(silero, TurnDetector(VadSettings(silence_duration_ms=500)))
    raw = float_to_pcm16_bytes(audio)
    found: list[object] = []
    heard = []
    at = 0
    for size in sizes:
        audio16k, events = front.hear(raw[2 * at : 2 * (at + size)])
        found += events
        heard.append(audio16k)
        at += size
    return found, np.concatenate(heard)


def test_a_question_in_one_sample_appends_is_heard_as_in_appends_of_2400(silero: SileroModel) -> None:
    """Filtered one append at a time, appends of 1 to 10 samples were never speech at all."""
    audio = np.concatenate([np.zeros(PCM16_RATE // 2, np.float32), question("spider_legs")[: PCM16_RATE]])
    whole, heard_whole = speech_events(silero, audio, [2_400] * (audio.size // 2_400) + [audio.size % 2_400])
    ones, heard_ones = speech_events(silero, audio, [1] * audio.size)
    assert [type(e).__name__ for e in whole] == ["SpeechStarted"]  # it starts in the first second
    assert ones == whole
    n = min(heard_whole.size, heard_ones.size)
    assert n >= audio.size * 2 // 3 - 16 and np.abs(heard_ones[:n] - heard_whole[:n]).max() < 1e-6


@pytest.mark.parametrize("codec", ["audio/pcmu", "audio/pcma"])
def test_g711_appends_decode_as_one_stream_whatever_their_sizes(codec: str) -> None:
    """A new resampler per append filtered each one's edges against silence: 1-byte appends of a
    tone decoded to a buzz. One decoder per session: the same samples as one append of it all."""
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(2_000) / 8_000)).astype(np.float32)  # 250 ms
    pcm = np.frombuffer(float_to_pcm16_bytes(tone), "<i2")
    data = bytes((ulaw_encode if codec == "audio/pcmu" else alaw_encode)(pcm))
    whole = np.frombuffer(AudioFrontEnd().to_pcm16(CODECS[codec], data), "<i2").astype(np.int32)
    for size in (1, 7, 160):
        front = AudioFrontEnd()
        pieces = b"".join(front.to_pcm16(CODECS[codec], data[i : i + size]) for i in range(0, len(data), size))
        chunked = np.frombuffer(pieces, "<i2").astype(np.int32)
        assert chunked.size == whole.size == 6_000  # three samples per byte at every append
        assert np.abs(chunked - whole).max() <= 1, size
    # the stream is what the one-shot conversion gives, 6.25 ms late (the filter's lag, paid once)
    once = np.frombuffer(CODECS[codec].to_pcm16(data), "<i2").astype(np.int32)
    assert not whole[:150].any() and np.abs(once[: whole.size - 150] - whole[150:]).max() <= 1


def test_a_change_of_input_format_starts_a_new_stream() -> None:
    front = AudioFrontEnd()
    assert front.to_pcm16(CODECS["audio/pcm"], b"\x01\x00") == b"\x01\x00"
    front.to_pcm16(CODECS["audio/pcmu"], bytes(800))
    assert front.to_pcm16(CODECS["audio/pcm"], b"\x02\x00") == b"\x02\x00"  # pcm again: as is


def test_an_append_with_no_audio_is_a_no_op_and_one_without_the_field_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """B2: under server VAD (the default), an append of "" or none at all was a server_error
    and a traceback in the log per event (np.convolve on an empty array)."""
    serving = ServingState(model_name="m", pipeline=ScriptedPipeline(), api_key="sk-test")
    http = TestClient(create_app(serving), base_url="http://localhost")
    caplog.set_level(logging.WARNING)
    with http, http.websocket_connect("ws://localhost/v1/realtime", headers={"Authorization": "Bearer sk-test"}) as ws:
        created = json.loads(ws.receive_text())
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        ws.send_text(json.dumps({"type": "input_audio_buffer.append", "event_id": "none"}))
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "audio")
        assert error["error"]["event_id"] == "none" and "audio" in error["error"]["message"]
        for _ in range(3):
            ws.send_text(json.dumps({"type": "input_audio_buffer.append", "event_id": "empty", "audio": ""}))
        one = base64.b64encode(bytes(2)).decode()  # and a one-sample append, heard as any
        ws.send_text(json.dumps({"type": "input_audio_buffer.append", "event_id": "one", "audio": one}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.clear", "event_id": "after"}))
        assert json.loads(ws.receive_text())["type"] == "input_audio_buffer.cleared"  # nothing came before it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.records


class SpeechThenQuiet:
    """A test double for Silero alone: speech for the first ``speech`` frames, then silence."""

    def __init__(self, speech: int) -> None:
        self.speech, self.frames = speech, 0

    def run(self, frame: np.ndarray, context: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[float, Any, Any]:
        self.frames += 1
        return (0.9 if self.frames <= self.speech else 0.0), h, c


class HeardTurnModel:
    """A test double for Smart Turn alone: keeps what it was asked about; always finished."""

    def __init__(self) -> None:
        self.heard: list[np.ndarray] = []

    def finished(self, audio: np.ndarray) -> float:
        self.heard.append(audio.copy())
        return 1.0


def test_the_turn_model_hears_the_same_turn_whatever_the_appends() -> None:
    """Smart Turn's buffer accumulates across appends: appends of 7 samples give it the audio
    2,400-sample appends do, up to where the silence began."""
    audio = (0.3 * np.sin(2 * np.pi * 300 * np.arange(int(1.7 * PCM16_RATE)) / PCM16_RATE)).astype(np.float32)
    raw = float_to_pcm16_bytes(audio)
    asked = []
    for size in (2_400, 7):
        model = HeardTurnModel()
        front = SpeechFrontEnd(SpeechThenQuiet(speech=40), SemanticTurnDetector(model, "auto"))  # type: ignore[arg-type]
        found = []
        for at in range(0, len(raw), 2 * size):
            found += front.hear(raw[at : at + 2 * size])[1]
        assert [type(e).__name__ for e in found] == ["SpeechStarted", "SpeechPaused", "SpeechStopped"]
        assert found[2].audio_end_ms == 40 * FRAME_MS  # type: ignore[attr-defined]
        asked.append(model.heard)
    (whole,), (ones,) = asked
    assert whole.size == ones.size == 40 * FRAME and np.abs(whole - ones).max() < 1e-6
