"""Every bound docs/security-limits.md states, held to the code that applies it.

Each entry names the docs' row (a table row by its first cell, or a bullet by a phrase of
its own), what the docs say the bound is there, and the value the code uses; the test
fails when the code's value differs from the figure written here (a bound loosened,
tightened or removed in the code alone) or when the docs' row no longer says it (the page
edited alone). A deliberate change of a bound changes all three. These are the values;
what happens at each bound is tested beside its code (tests/serving/common,
tests/serving/transcriptions, tests/audio, tests/serving/realtime...).

Module-level constants are out of mutation testing's reach (mutmut 3 mutates function
bodies only), which is why they are pinned here by value.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "security-limits.md"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Bound:
    row: str  # a table row's first cell, exactly; or a phrase the bullet holds
    says: str  # what the docs' row says the bound is (a substring of the row)
    code: Callable[[], Any]  # the code's value, read when the test runs
    value: Any  # the figure the docs' words mean


def _limits() -> Any:
    from omnictl.serving.chat.protocol import Limits

    return Limits()


def _serve_default(option: str) -> Any:
    """The default of one `omnictl serve` option (its Python parameter name)."""
    from omnictl.cli.serve import serve_command

    return inspect.signature(serve_command).parameters[option].default


def _attr(module: str, name: str) -> Callable[[], Any]:
    def read() -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)

    return read


CONNECTIONS = "request headers must be complete within"
AUDIOFILE = "omnictl.serving.transcriptions.audiofile"
WEBRTC = "omnictl.serving.realtime.webrtc"

BOUNDS = [
    # Connections
    Bound(CONNECTIONS, "10 s of opening", lambda: _limits().header_timeout_s, 10.0),
    Bound(CONNECTIONS, "10 s of opening", lambda: _serve_default("header_timeout"), 10.0),
    Bound("request body must arrive within", "30 s", lambda: _limits().body_timeout_s, 30.0),
    Bound("request body must arrive within", "30 s", lambda: _serve_default("body_timeout"), 30.0),
    Bound(
        "open connections (HTTP and WebSocket together)",
        "less 256 kept for the server's own files",
        _attr("omnictl.serving.common.connections", "RESERVED_FDS"),
        256,
    ),
    # Requests into the pipeline
    Bound("`--max-in-flight` (64)", "`--max-in-flight` (64)", lambda: _serve_default("max_in_flight"), 64),
    Bound("`--max-in-flight` (64)", "`--max-in-flight` (64)", _attr("omnictl.admission", "DEFAULT_MAX_IN_FLIGHT"), 64),
    Bound("`--max-queue-wait` (0 s)", "`--max-queue-wait` (0 s)", lambda: _serve_default("max_queue_wait"), 0.0),
    Bound("relay.inbox", "`relay.inbox` (32)", lambda: _relay_inbox(), 32),
    Bound("until `--request-timeout` (300 s)", "`--request-timeout` (300 s)",
          lambda: _serve_default("request_timeout"), 300.0),
    Bound("Bodies: `--max-body-mb` (32)", "`--max-body-mb` (32)", lambda: _limits().max_body_bytes, 32 * MiB),
    Bound("Bodies: `--max-body-mb` (32)", "`--max-body-mb` (32)", lambda: _serve_default("max_body_mb"), 32.0),
    Bound("one decoded input audio part `--max-audio-mb` (16)", "`--max-audio-mb` (16)",
          lambda: _limits().max_audio_bytes, 16 * MiB),
    Bound("one decoded input audio part `--max-audio-mb` (16)", "`--max-audio-mb` (16)",
          lambda: _serve_default("max_audio_mb"), 16.0),
    Bound("JSON nested at most 32 levels", "JSON nested at most 32 levels",
          _attr("omnictl.serving.common.jsonbody", "MAX_DEPTH"), 32),
    Bound("sample rates 1 kHz–384 kHz", "sample rates 1 kHz–384 kHz", _attr("omnictl.audio.bounds", "MIN_RATE"), 1000),
    Bound("sample rates 1 kHz–384 kHz", "sample rates 1 kHz–384 kHz", _attr("omnictl.audio.bounds", "MAX_RATE"), 384_000),
    # Client media
    Bound("duration of one audio input", "600 s", lambda: _limits().max_audio_seconds, 600.0),
    Bound("decoded samples of one audio input, **every channel counted**", "the duration limit × 96,000",
          _attr("omnictl.audio.bounds", "DECODE_SAMPLES_PER_SECOND"), 96_000),
    Bound("decoded samples of one audio input, **every channel counted**", "600 s of stereo at 48 kHz: 57,600,000",
          lambda: _decode_budget(600.0), 57_600_000),
    Bound("rate of decoded uploads", "resampled to 48 kHz", _attr(AUDIOFILE, "OUTPUT_MAX_RATE"), 48_000),
    Bound("packets of one upload (and the frames they decode to), **every stream's counted**",
          "1,000 per second of audio decoded so far, and 1,000 more",
          _attr("omnictl.audio.bounds", "PACKETS_PER_SECOND"), 1_000),
    Bound("packets of one upload (and the frames they decode to), **every stream's counted**",
          "1,000 per second of audio decoded so far, and 1,000 more", lambda: _packet_allowance(2.5), 3_500),
    Bound("memory of one upload's decode", "the resampler fed 16,384 samples at a time",
          _attr(AUDIOFILE, "_CHUNK"), 16_384),
    Bound("where an upload is decoded", "checked every 100 ms",
          _attr("omnictl.serving.transcriptions.route", "HANGUP_POLL_S"), 0.1),
    Bound("what FFmpeg may open besides the upload", "no protocol (`protocol_whitelist` empty)",
          _attr(AUDIOFILE, "_OPEN_OPTIONS"),
          {"protocol_whitelist": "none", "enable_drefs": "0", "use_absolute_path": "0"}),
    Bound("container formats of an upload (`/v1/audio/transcriptions`, `/translations`)",
          "WAV, mp3, AAC (ADTS), mp4/m4a, Ogg, WebM/Matroska, FLAC, CAF, AIFF, AMR",
          _attr(AUDIOFILE, "FORMATS"),
          ("wav", "mp3", "aac", "mp4/m4a", "ogg", "webm/matroska", "flac", "caf", "aiff", "amr")),
    # /v1/realtime sessions
    Bound("sessions at once (per server), WebSocket and WebRTC together, counted from the moment the handshake "
          "or the offer arrives", "16", lambda: _limits().max_realtime_sessions, 16),
    Bound("sessions at once (per server), WebSocket and WebRTC together, counted from the moment the handshake "
          "or the offer arrives", "16", lambda: _serve_default("max_realtime_sessions"), 16),
    Bound("WebRTC calls not yet connected (offer arrived, peer connection not connected), among those sessions",
          "4", lambda: _limits().max_realtime_connecting, 4),
    Bound("WebRTC calls not yet connected (offer arrived, peer connection not connected), among those sessions",
          "4", lambda: _serve_default("max_connecting_calls"), 4),
    Bound("a WebRTC offer", "64 KiB", _attr(WEBRTC, "MAX_OFFER_BYTES"), 64 * 1024),
    Bound("a WebRTC call that does not connect (from its offer's arrival) / on which nothing arrives", "10 s / 5 min",
          lambda: (_limits().realtime_connect_timeout_s, _serve_default("call_connect_timeout")), (10.0, 10.0)),
    Bound("a WebRTC call that does not connect (from its offer's arrival) / on which nothing arrives", "10 s / 5 min",
          _attr(WEBRTC, "IDLE_TIMEOUT_S"), 300.0),
    Bound("events and microphone pieces waiting for a WebRTC session", "200 items, 4 MiB",
          lambda: (_attr(WEBRTC, "INBOX_ITEMS")(), _attr(WEBRTC, "INBOX_BYTES")()), (200, 4 * MiB)),
    Bound("events on a WebRTC data channel", "a burst of 200, then 100 a second",
          lambda: (_attr(WEBRTC, "CHANNEL_BURST")(), _attr(WEBRTC, "CHANNEL_EVENTS_PER_S")()), (200.0, 100.0)),
    Bound("one client event (WebSocket message or data channel message)", "1 MiB",
          lambda: _limits().max_realtime_message_bytes, MiB),
    Bound("input audio buffer", "120 s of 24 kHz pcm16 (5.76 MB)",
          lambda: _limits().max_realtime_buffer_bytes, 5_760_000),
    Bound("input audio rate", "a burst of 240 s (two full input buffers), then 8× real time",
          lambda: (_limits().realtime_audio_burst_s, _limits().realtime_audio_speed), (240.0, 8.0)),
    Bound("what the session holds (input buffer, the conversation's audio and text, audio being transcribed)",
          "32 MiB", lambda: _limits().max_realtime_session_bytes, 32 * MiB),
    Bound("the conversation", "64 items and ~6,000 tokens",
          lambda: (_attr("omnictl.serving.realtime.turns", "MAX_ITEMS")(), _limits().max_realtime_conversation_tokens),
          (64, 6_000)),
    Bound("server events waiting for a client that does not read", "8 MiB",
          lambda: _limits().max_realtime_outbox_bytes, 8 * MiB),
    Bound("in two worker threads shared by every session", "in two worker threads",
          _attr("omnictl.serving.realtime.vad", "VAD_WORKERS"), 2),
    Bound("are clipped to 200 characters", "clipped to 200 characters",
          _attr("omnictl.serving.common.echo", "ECHO_CHARS"), 200),
    Bound("is logged once per 10 s", "once per 10 s", lambda: _echo_interval(), 10.0),
    Bound("`event_id`s longer than 128", "`event_id`s longer than 128",
          _attr("omnictl.serving.realtime.events", "MAX_EVENT_ID"), 128),
    # The fourth pass
    Bound("**`logit_bias` keys are token ids from 0 to 2^31 − 1**", "from 0 to 2^31 − 1",
          _attr("omnictl.sampling", "MAX_TOKEN_ID"), 2**31 - 1),
    Bound("**One request's share of the trace store**", "1/32 of its rotation (4 MiB of the default 128 MiB",
          lambda: _trace_share(), (32, 128 * MiB, 4 * MiB)),
]


def _relay_inbox() -> int:
    from omnictl.transports.kinds import RelayKnobs

    return RelayKnobs().inbox


def _decode_budget(seconds: float) -> int:
    from omnictl.audio.bounds import decode_budget

    return decode_budget(seconds)


def _packet_allowance(seconds: float) -> int:
    from omnictl.audio.bounds import packet_allowance

    return packet_allowance(seconds)


def _echo_interval() -> float:
    from omnictl.serving.common.echo import RepeatLimiter

    return RepeatLimiter().interval_s


def _trace_share() -> tuple[int, int, int]:
    from omnictl.profiling.collector import Collector
    from omnictl.profiling.store import REQUEST_SHARE, TraceStore

    defaults = inspect.signature(Collector.__init__).parameters
    whole = defaults["segment_bytes"].default * defaults["max_segments"].default
    store = inspect.signature(TraceStore.__init__).parameters
    assert store["segment_bytes"].default * store["max_segments"].default == whole  # one default, both places
    return REQUEST_SHARE, whole, whole // REQUEST_SHARE


def _words(text: str) -> str:
    return " ".join(text.split())  # the page wraps its bullets anywhere


def _row(text: str, first: str) -> str:
    """The docs' table row whose first cell is ``first``, else the bullet or paragraph
    holding it (its lines joined)."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells and cells[0] == first:
            return _words(line)
    for paragraph in re.split(r"\n\s*\n|\n(?=- )", text):
        if first in _words(paragraph):
            return _words(paragraph)
    raise AssertionError(f"{DOCS.relative_to(REPO)} has no row or bullet naming {first!r}")


@pytest.mark.parametrize("bound", BOUNDS, ids=lambda b: f"{b.row[:40]}={b.value!r}"[:90])
def test_the_code_applies_the_bound_the_docs_state(bound: Bound) -> None:
    row = _row(DOCS.read_text(), bound.row)
    assert bound.says in row, f"{DOCS.relative_to(REPO)}: the row {bound.row!r} no longer says {bound.says!r}:\n{row}"
    assert bound.code() == bound.value, (
        f"the code's bound for {bound.row!r} is {bound.code()!r}; {DOCS.relative_to(REPO)} says {bound.says!r} "
        f"({bound.value!r}): change both, deliberately, or neither"
    )


def test_every_limits_field_and_serve_default_is_pinned() -> None:
    """A bound added to ``Limits`` without a row here fails, naming it: each one a client
    can hit is on the page and held to it."""
    from dataclasses import fields

    from omnictl.serving.chat.protocol import Limits

    source = Path(__file__).read_text()
    unpinned = sorted(
        f.name for f in fields(Limits) if f"_limits().{f.name}" not in source and f.name != "max_connections"
    )
    # max_connections has no number of its own (None: the open-files limit less
    # RESERVED_FDS, pinned above)
    assert not unpinned, f"Limits fields with no documented bound pinned in {Path(__file__).name}: {unpinned}"
