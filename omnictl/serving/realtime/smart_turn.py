"""Semantic end of turn: Smart Turn v3.2 (BSD-2, the ONNX model ``pipecat-ai`` ships) over
ONNX Runtime, with Silero VAD for where speech starts and stops.

Silence alone ends a turn at the first pause, even mid-sentence. Here a pause is first a
question to the turn model: after ``check_ms`` of silence it hears the turn so far (the
last 8 s up to where the silence began, as Whisper log-mel features: the model judges
the voice, and trailing silence only blurs it) and says whether the speaker has finished. If so,
the turn ends there; if not, the turn waits for more speech, and ends anyway after
``cap_ms`` of silence (the fallback: a speaker who trails off is answered all the same).
``eagerness`` (the protocol's names) sets both, and how sure the model must be: caps as
OpenAI's own (low 8 s, medium 4 s, high 2 s; ``auto`` is medium).

As :class:`~omnictl.serving.realtime.vad.TurnDetector`, it says :class:`SpeechPaused` after
``preempt_ms`` of silence (unless the turn ends sooner) and :class:`SpeechResumed` if speech
comes back before the turn ends: a preemptive answer starts at the pause.

The features are Whisper's (80 log-mel bins, 25 ms windows every 10 ms, 8 s), as the
model was trained on them (``transformers.WhisperFeatureExtractor`` with ``chunk_length=8``
and a normalised waveform): faster-whisper's extractor computes them, the one its Whisper
(the server's recogniser, and the package that ships Silero) uses. On the packaged sample
questions they are within 7e-6 of pipecat's own reference and the model's answers the same
to five decimals (tests/serving/realtime/test_semantic_vad.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from omnictl.exceptions import LaunchError
from omnictl.serving.realtime.vad import (
    _HYSTERESIS,
    FRAME,
    PREEMPT_MS,
    VAD_RATE,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnEvent,
    pause_frames,
)

WINDOW_S = 8  # of audio the model hears, the last of the turn
_KEEP = VAD_RATE * (WINDOW_S + 9)  # samples kept: the window, and the longest silence after it (the low cap)
_N_MELS = 80

# eagerness -> (ms of silence before the model is asked, ms of silence that ends a turn regardless,
# the model's probability of a finished turn from which it is taken as finished)
# medium and auto take p >= 0.8 (it was 0.5), as low does: on the sample questions the model
# says 0.26 to 0.97 at the mid-sentence pauses and 0.92 to 0.98 at every true end
# (benchmarks/realtime_turn_detection.py), so 0.8 keeps one more paused question whole (0.75 at
# its pause) and still ends every plain one at the first check. One stays cut: the model says
# 0.97 after "How many days are in a".
EAGERNESS = {
    "high": (150, 2000, 0.3),
    "medium": (300, 4000, 0.8),
    "auto": (300, 4000, 0.8),
    "low": (600, 8000, 0.8),
}


def smart_turn_model_path() -> Path:
    """The Smart Turn v3.2 ONNX file inside the installed pipecat-ai package."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or spec.origin is None:
        raise LaunchError(
            "realtime", "semantic_vad needs pipecat-ai (pip install pipecat-ai): it ships the Smart Turn model"
        )
    path = Path(spec.origin).parent / "audio" / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx"
    if not path.is_file():
        raise LaunchError("realtime", f"no Smart Turn v3.2 model at {path} (pipecat-ai too old or too new?)")
    return path


@lru_cache(maxsize=1)
def _extractor() -> Any:
    """faster-whisper's log-mel extractor for 8 s windows (one, shared: a call changes no state of it)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    return FeatureExtractor(feature_size=_N_MELS, sampling_rate=VAD_RATE, chunk_length=WINDOW_S)


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper's (80, 800) log-mel features of 8 s of 16 kHz audio (shorter audio is padded)."""
    x = np.zeros(VAD_RATE * WINDOW_S, np.float32)
    x[: min(audio.size, x.size)] = audio[: x.size]
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)  # the normalised waveform Smart Turn was trained on
    # padding=0: the window is whole already (faster-whisper's own transcription pads 160 samples)
    features = _extractor()(x, padding=0)
    return np.asarray(features, dtype=np.float32)


class SmartTurnModel:
    """One ONNX session, shared by every session's detector."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1  # one core per call: sessions share two VAD workers
        options.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(
            str(path or smart_turn_model_path()), providers=["CPUExecutionProvider"], sess_options=options
        )

    def finished(self, audio: np.ndarray) -> float:
        """The probability that the speaker has finished, from the turn's last 8 s (16 kHz).
        The audio is placed at the end of the window, as the model was trained."""
        window = np.zeros(VAD_RATE * WINDOW_S, np.float32)
        tail = audio[-window.size :]
        window[window.size - tail.size :] = tail
        (out,) = self.session.run(None, {"input_features": log_mel(window)[None]})
        return float(np.asarray(out).reshape(-1)[0])


_shared: SmartTurnModel | None = None


def shared_model() -> SmartTurnModel:
    """The server's one Smart Turn session, loaded when the first session asks for semantic_vad."""
    global _shared
    if _shared is None:
        _shared = SmartTurnModel()
    return _shared


@dataclass
class SemanticTurnDetector:
    """Speech started / stopped from Silero frame probabilities and the turn model."""

    model: SmartTurnModel
    eagerness: str = "auto"
    threshold: float = 0.5  # Silero's speech probability for speech to start
    preempt_ms: int | None = PREEMPT_MS  # None: no pauses (no preemptive answers)
    frame_ms: float = FRAME * 1000 / VAD_RATE
    frames: int = 0
    speaking: bool = False
    paused: bool = False  # a SpeechPaused was said and neither a stop nor a resume since
    asked: list[float] = field(default_factory=list)  # the model's answers, for the log and the benchmark
    _quiet_frames: int = 0
    _checked: bool = False
    # the last 8 s and more, in the pieces fed (joined when the model hears them, or when they
    # hold twice what is kept): joining 17 s at every append cost ~0.1 ms per append, which a
    # stream of one-sample appends makes seconds per second
    _pieces: list[np.ndarray] = field(default_factory=list)
    _held: int = 0  # samples in _pieces
    _fed: int = 0  # samples fed so far (the last of them is the last piece's last)

    def drop_turn(self) -> None:
        """Forget the speech in progress (it was the answer's echo): the next speech starts afresh."""
        self.speaking, self._quiet_frames, self._checked, self.paused = False, 0, False, False

    def feed(self, probabilities: list[float], audio: np.ndarray) -> list[TurnEvent]:
        """``audio``: the 16 kHz samples these probabilities were computed from."""
        if audio.size:
            self._pieces.append(audio.astype(np.float32, copy=False))
            self._held += audio.size
            self._fed += audio.size
            if self._held > 2 * _KEEP:
                self._joined()
        check_ms, cap_ms, complete = EAGERNESS[self.eagerness]
        pause_needed = pause_frames(self.preempt_ms, self.frame_ms)
        events: list[TurnEvent] = []
        for probability in probabilities:
            self.frames += 1
            if not self.speaking:
                if probability >= self.threshold:
                    self.speaking, self._quiet_frames, self._checked = True, 0, False
                    events.append(SpeechStarted(int((self.frames - 1) * self.frame_ms)))
                continue
            if probability >= self.threshold - _HYSTERESIS:
                self._quiet_frames, self._checked = 0, False  # speech goes on: ask again at the next pause
                if self.paused:
                    self.paused = False
                    events.append(SpeechResumed())
                continue
            self._quiet_frames += 1
            quiet_ms = self._quiet_frames * self.frame_ms
            done = quiet_ms >= cap_ms
            if not done and not self._checked and quiet_ms >= check_ms:
                self._checked = True
                spoken_end = (self.frames - self._quiet_frames) * FRAME  # the sample where the silence began
                heard = self._joined()
                self.asked.append(self.model.finished(heard[: max(0, heard.size - (self._fed - spoken_end))]))
                done = self.asked[-1] >= complete
            if done:
                self.speaking = self.paused = False
                events.append(SpeechStopped(int((self.frames - self._quiet_frames) * self.frame_ms)))
            elif pause_needed is not None and self._quiet_frames == pause_needed:
                self.paused = True
                events.append(SpeechPaused(int((self.frames - self._quiet_frames) * self.frame_ms)))
        return events

    def _joined(self) -> np.ndarray:
        """The audio kept (at most the last ``_KEEP`` samples), as one array."""
        audio = np.concatenate(self._pieces)[-_KEEP:] if self._pieces else np.zeros(0, np.float32)
        self._pieces, self._held = [audio], audio.size
        return audio
