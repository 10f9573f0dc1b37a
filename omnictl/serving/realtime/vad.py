"""Server VAD: Silero VAD (the ONNX model faster-whisper ships) run frame by frame.

:class:`SileroVad` gives the speech probability of each 32 ms frame of 16 kHz audio,
carrying the model's recurrent state between calls, so audio can be fed as it arrives.
:class:`TurnDetector` turns those probabilities into the Realtime protocol's turns:
speech starts at the first frame at or above ``threshold``; it stops once frames stay
below ``threshold - 0.15`` (Silero's own hysteresis) for ``silence_duration_ms``.
Times are milliseconds of audio since the session's first appended sample.

Before it stops, speech *pauses*: after ``preempt_ms`` of that silence (:data:`PREEMPT_MS`)
the detector says :class:`SpeechPaused`, where the session starts its answer preemptively
(:mod:`omnictl.serving.realtime.session.replies`); if speech comes back before the stop it
says :class:`SpeechResumed` (the preemptive answer is dropped). A stop always follows a
pause at the same ``audio_end_ms`` unless speech resumed between them.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omnictl.audio import resample
from omnictl.audio.resample import StreamResampler
from omnictl.exceptions import LaunchError
from omnictl.serving.realtime.events import SILENCE_MS

VAD_RATE = 16_000
FRAME = 512  # samples per frame at 16 kHz: what the model is trained on (32 ms)
_CONTEXT = 64  # samples of the previous frame the model sees before each frame
_HYSTERESIS = 0.15


def silero_model_path() -> Path:
    """The Silero VAD ONNX file inside the installed faster-whisper package."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or spec.origin is None:
        raise LaunchError(
            "realtime", "server VAD needs faster-whisper (pip install faster-whisper): it ships the Silero VAD model"
        )
    assets = Path(spec.origin).parent / "assets"
    found = sorted(assets.glob("silero_vad*.onnx"))
    if not found:
        raise LaunchError("realtime", f"no Silero VAD model (silero_vad*.onnx) in {assets}")
    return found[-1]


VAD_WORKERS = 2  # threads running every session's VAD: at most this many cores, whatever the sessions send
_executor: ThreadPoolExecutor | None = None


def vad_executor() -> ThreadPoolExecutor:
    """The worker threads server VAD runs in, off the event loop (ONNX Runtime releases the GIL)."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=VAD_WORKERS, thread_name_prefix="realtime-vad")
    return _executor


class SileroModel:
    """One ONNX session, shared by every session's detector (each keeps its own state)."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1  # a frame costs ~0.2 ms; threads would cost more than they save
        options.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(
            str(path or silero_model_path()), providers=["CPUExecutionProvider"], sess_options=options
        )

    def run(
        self, frame: np.ndarray, context: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        window = np.concatenate([context, frame])[None, :].astype(np.float32, copy=False)
        probs, h, c = self.session.run(None, {"input": window, "h": h, "c": c})
        return float(np.asarray(probs).reshape(-1)[0]), h, c


def to_vad_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """``samples`` at 16 kHz. From 24 kHz (every realtime session) a low-pass and a 3:2
    decimation (one C convolution, ~100x cheaper than the general band-limited resampler,
    which cost ~1 s per 16 s of audio: a flood of appends kept two cores busy); good enough
    for a speech/no-speech decision (:func:`omnictl.audio.resample`'s ``fast`` quality). Other
    rates get its ``high`` quality."""
    # from 24 kHz the toolkit's "fast" quality is exactly that low-pass and 3:2 decimation
    return resample(samples, rate, VAD_RATE, quality="fast" if rate == 24_000 else "high")


@dataclass
class SileroVad:
    """Speech probability per frame of a stream of audio at any rate, fed in pieces of any
    size: one resampler kept open from piece to piece (the qualities :func:`to_vad_rate`
    picks; at 16 kHz none), and the samples short of a frame carried to the next piece."""

    model: SileroModel
    rate: int
    _pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _context: np.ndarray = field(default_factory=lambda: np.zeros(_CONTEXT, np.float32))
    _h: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    _c: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 128), np.float32))
    _resampler: StreamResampler = field(init=False)

    def __post_init__(self) -> None:
        self._resampler = StreamResampler(self.rate, VAD_RATE, "fast" if self.rate == 24_000 else "high")

    def feed(self, samples: np.ndarray) -> list[float]:
        """The probabilities of the frames ``samples`` completes (each FRAME / 16 kHz long)."""
        audio = self._resampler.push(samples)
        self._pending = np.concatenate([self._pending, audio.astype(np.float32, copy=False)])
        probabilities = []
        while self._pending.size >= FRAME:
            frame, self._pending = self._pending[:FRAME], self._pending[FRAME:]
            probability, self._h, self._c = self.model.run(frame, self._context, self._h, self._c)
            self._context = frame[-_CONTEXT:]
            probabilities.append(probability)
        return probabilities


# ms of silence after speech at which the answer starts preemptively (the turn not confirmed
# yet). 200 ms: below every confirmation point (server_vad's 700 ms default, semantic_vad's
# first check at 300 ms) so the answer gets a head start of 100 to 300 ms; above the silences
# inside words and between most words of running speech (stop closures and word gaps are
# mostly under 150 ms), which would otherwise start and drop an answer at every gap: each
# drop costs a transcription and a prefill on a 2-core machine. Six Silero frames (32 ms).
PREEMPT_MS = 200


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = SILENCE_MS
    preempt_ms: int | None = PREEMPT_MS  # None: no pauses (no preemptive answers)


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


@dataclass(frozen=True)
class SpeechPaused:
    """Speech has been quiet ``preempt_ms`` since ``audio_end_ms``: the turn may be ending."""

    audio_end_ms: int


@dataclass(frozen=True)
class SpeechResumed:
    """Speech came back after a :class:`SpeechPaused`, before the turn ended."""


TurnEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


def pause_frames(preempt_ms: int | None, frame_ms: float) -> int | None:
    """Quiet frames that make a pause; None when pauses are off."""
    return None if preempt_ms is None or preempt_ms <= 0 else max(1, round(preempt_ms / frame_ms))


@dataclass
class TurnDetector:
    """Speech started / paused / resumed / stopped events from a stream of frame probabilities."""

    settings: VadSettings
    frame_ms: float = FRAME * 1000 / VAD_RATE
    frames: int = 0  # frames seen so far
    speaking: bool = False
    paused: bool = False  # a SpeechPaused was said and neither a stop nor a resume since
    _quiet_frames: int = 0
    _start_frame: int = 0

    def drop_turn(self) -> None:
        """Forget the speech in progress (it was the answer's echo): the next speech starts afresh."""
        self.speaking, self._quiet_frames, self.paused = False, 0, False

    def feed(self, probabilities: list[float]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        quiet_needed = max(1, round(self.settings.silence_duration_ms / self.frame_ms))
        pause_needed = pause_frames(self.settings.preempt_ms, self.frame_ms)
        for probability in probabilities:
            self.frames += 1
            if not self.speaking:
                if probability >= self.settings.threshold:
                    self.speaking, self._quiet_frames, self._start_frame = True, 0, self.frames - 1
                    events.append(SpeechStarted(int(self._start_frame * self.frame_ms)))
                continue
            end = self.frames - self._quiet_frames - 1  # where the silence began, counting this frame
            if probability < self.settings.threshold - _HYSTERESIS:
                self._quiet_frames += 1
                if self._quiet_frames >= quiet_needed:
                    self.speaking = self.paused = False
                    events.append(SpeechStopped(int(end * self.frame_ms)))
                elif pause_needed is not None and self._quiet_frames == pause_needed:
                    self.paused = True
                    events.append(SpeechPaused(int(end * self.frame_ms)))
            else:
                self._quiet_frames = 0
                if self.paused:
                    self.paused = False
                    events.append(SpeechResumed())
        return events
